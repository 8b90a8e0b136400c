"""What GPU a job will run on, as the SDK takes it and the scheduler reads it.

Users rarely need one exact GPU; they need "an H100, or failing that an
A100 80 GB", or "any GPU", or "a GPU if one comes soon, else the CPU". The
request is therefore an ordered list of acceptable types, checked against the
catalog when the job is defined, so a typo fails on the user's machine with the
closest valid names instead of leaving a job pending forever on a type no pool
offers.

Writing the preference
----------------------
``gpu="H100"``
    one type;
``gpu=["H100", "A100-80", "L40S"]``
    the first listed that can be had, in that order;
``gpu="any"``
    any GPU type (cannot be mixed with named types);
``gpu=None``
    CPU only;
``fallback=["cpu"]``, or ``"cpu"`` as the last entry of ``gpu``
    run on CPU if no listed GPU could be had within ``fallback_after`` seconds.
    The two spellings mean the same thing; writing it inside the list reads
    naturally ("H100, else A100-80, else CPU") and keeps the order visible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from levers9.gpu.catalog import canonical

__all__ = ["ALLOWED_GPU_COUNTS", "DEFAULT_FALLBACK_AFTER_S", "GpuRequest", "parse_gpu", "parse_gpu_or_count"]

#: GPUs per job. A job runs on one machine and machines carry 1, 2, 4 or 8 GPUs; these
#: sizes match how GPUs are wired inside a machine (NVLink or PCIe-switch pairs and quads),
#: so a job's GPUs can talk to each other fast, and jobs of these sizes pack a machine
#: without leaving odd GPUs over.
ALLOWED_GPU_COUNTS = (1, 2, 4, 8)
DEFAULT_FALLBACK_AFTER_S = 60.0

_ANY = "any"
_CPU = "cpu"


class GpuRequest(BaseModel):
    """A job's GPU preference, with every name already canonical."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: acceptable canonical types, most preferred first; empty with ``any_gpu`` False means CPU only
    types: tuple[str, ...] = ()
    #: any GPU type will do (``gpu="any"``)
    any_gpu: bool = False
    #: GPUs per job: 0 for a CPU job, else one of :data:`ALLOWED_GPU_COUNTS`
    count: int = 0
    #: run on CPU when no acceptable GPU could be had within ``fallback_after_s``
    fallback_cpu: bool = False
    #: how long the job waits for one of its GPUs before the CPU fallback is taken
    fallback_after_s: float = Field(DEFAULT_FALLBACK_AFTER_S, ge=0)

    @field_validator("types")
    @classmethod
    def _canonical_types(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        names = tuple(canonical(name) for name in value)
        _reject_duplicates(value, names)
        return names

    @field_validator("fallback_after_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("fallback_after must be a finite number of seconds")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> GpuRequest:
        if self.any_gpu and self.types:
            raise ValueError('gpu="any" cannot be combined with named GPU types')
        if self.wants_gpu:
            if self.count not in ALLOWED_GPU_COUNTS:
                raise ValueError(_count_message(self.count))
        else:
            if self.count != 0:
                raise ValueError(f"gpu_count={self.count} was given without a gpu; a CPU job has no GPUs")
            if self.fallback_cpu:
                raise ValueError("a CPU fallback needs a GPU to fall back from")
        return self

    # ------------------------------------------------------------------ reading it

    @property
    def wants_gpu(self) -> bool:
        """Whether the job asks for a GPU at all (even one it may fall back from)."""
        return self.any_gpu or bool(self.types)

    @property
    def cpu_only(self) -> bool:
        return not self.wants_gpu

    def accepts(self, gpu_type: str | None) -> bool:
        """Whether a machine with ``gpu_type`` (None for a CPU machine) may run this job.

        A CPU-only job does not accept GPU machines: it would hold a GPU it
        cannot use, and GPU capacity is what other jobs are waiting for.
        """
        return self.rank(gpu_type) is not None

    def rank(self, gpu_type: str | None) -> int | None:
        """Where ``gpu_type`` stands in the preference (0 is best), or None when it is not acceptable.

        ``any`` ranks every GPU 0. A CPU machine ranks after every GPU choice
        (``len(types)``, or 1 after ``any``) when the CPU fallback is on, and 0
        for a CPU-only job. Names are read loosely (``h100`` is H100); a name
        the catalog does not know is simply not acceptable.
        """
        if gpu_type is None:
            if self.cpu_only:
                return 0
            if self.fallback_cpu:
                return len(self.types) if self.types else 1
            return None
        try:
            name = canonical(gpu_type)
        except ValueError:
            return None
        if self.any_gpu:
            return 0
        try:
            return self.types.index(name)
        except ValueError:
            return None

    def describe(self) -> str:
        """One line for ``levers9 jobs``, placement reports and error messages."""
        if self.cpu_only:
            return "CPU only"
        choices = "any GPU" if self.any_gpu else ", else ".join(self.types)
        text = f"{self.count}x {choices}"
        if self.fallback_cpu:
            text += f", else CPU after {self.fallback_after_s:g} s"
        return text

    # ------------------------------------------------------------------ building it

    @classmethod
    def parse(
        cls,
        gpu: str | Sequence[str] | None,
        gpu_count: int | None = None,
        fallback: Sequence[str] | None = None,
        fallback_after: float | None = None,
    ) -> GpuRequest:
        """Same as :func:`parse_gpu`."""
        return parse_gpu(gpu, gpu_count=gpu_count, fallback=fallback, fallback_after=fallback_after)


def _reject_duplicates(written: Sequence[str], names: Sequence[str]) -> None:
    seen: dict[str, str] = {}
    for original, name in zip(written, names, strict=True):
        if name in seen:
            same = f"{seen[name]!r} and {original!r} both mean" if seen[name] != original else "twice:"
            raise ValueError(f"gpu lists the same type {same} {name}; list each type once")
        seen[name] = original


def _count_message(count: object) -> str:
    allowed = ", ".join(str(n) for n in ALLOWED_GPU_COUNTS[:-1]) + f" or {ALLOWED_GPU_COUNTS[-1]}"
    return (
        f"gpu_count must be {allowed}, not {count!r}: a job runs on one machine, machines carry "
        f"{allowed} GPUs, and only these sizes line up with how a machine's GPUs are linked "
        "and pack machines without leaving GPUs over"
    )


def parse_gpu(
    gpu: str | Sequence[str] | None,
    gpu_count: int | None = None,
    fallback: Sequence[str] | None = None,
    fallback_after: float | None = None,
) -> GpuRequest:
    """Turn the SDK's ``gpu=``, ``gpu_count=``, ``fallback=`` and ``fallback_after=`` into a request.

    See the module docstring for the forms accepted.

    :raises UnknownGpuType: a name is not in the catalog (the message lists the closest ones);
        ``AmbiguousGpuType`` for a bare ``A100``.
    :raises ValueError: anything else that cannot be honoured, saying what can.
    """
    entries = _entries(gpu)
    words = [entry.strip().lower() for entry in entries]
    fallback_cpu = False
    if _CPU in words:
        position = words.index(_CPU)
        if position != len(words) - 1:
            raise ValueError(
                '"cpu" must be the last entry of gpu: it is the fallback taken when no GPU before it '
                "can be had, so nothing after it would ever be tried"
            )
        entries, words = entries[:-1], words[:-1]
        # ["cpu"] alone is a CPU job, not a fallback from nothing.
        fallback_cpu = bool(entries)

    any_gpu = False
    if _ANY in words:
        if len(words) > 1:
            raise ValueError('gpu="any" cannot be combined with named GPU types; list the types instead')
        any_gpu, entries = True, []

    types = tuple(canonical(entry) for entry in entries)
    _reject_duplicates(entries, types)
    wants_gpu = any_gpu or bool(types)

    if fallback is not None:
        asked = [fallback] if isinstance(fallback, str) else list(fallback)
        if [str(item).strip().lower() for item in asked] != [_CPU]:
            raise ValueError(f'fallback accepts only ["cpu"] for now, not {asked!r}')
        fallback_cpu = fallback_cpu or wants_gpu

    if fallback_after is not None:
        _check_fallback_after(fallback_after, wants_gpu=wants_gpu, fallback_cpu=fallback_cpu)
    return GpuRequest(
        types=types,
        any_gpu=any_gpu,
        count=_count(gpu_count, wants_gpu=wants_gpu),
        fallback_cpu=fallback_cpu,
        fallback_after_s=DEFAULT_FALLBACK_AFTER_S if fallback_after is None else float(fallback_after),
    )


def parse_gpu_or_count(gpu: str | Sequence[str] | None, gpu_count: int | None) -> GpuRequest:
    """:func:`parse_gpu` for a request where a count alone asks for GPUs of any type (a sandbox's
    ``gpu_count=2``) and ``gpu_count=0`` without a ``gpu`` for none.

    :raises ValueError: naming the field first (``gpu: ...`` or ``gpu_count: ...``), then what is accepted.
    """
    if gpu is None and isinstance(gpu_count, int) and not isinstance(gpu_count, bool) and gpu_count > 0:
        gpu = "any"
    if gpu is None and gpu_count == 0:
        gpu_count = None
    try:
        return parse_gpu(gpu, gpu_count=gpu_count)
    except (TypeError, ValueError) as exc:  # UnknownGpuType is a ValueError, listing the closest names
        field = "gpu_count" if "gpu_count" in str(exc) else "gpu"
        raise ValueError(f"{field}: {exc}") from None


def _entries(gpu: object) -> list[str]:
    """``gpu=`` as a list of strings: none for None, one for a string, the list's own otherwise."""
    entries: list[object]
    if gpu is None:
        entries = []
    elif isinstance(gpu, str):
        entries = [gpu]
    elif isinstance(gpu, Sequence):
        entries = list(gpu)
        if not entries:
            raise ValueError("gpu=[] names no GPU; use gpu=None for a CPU job")
    else:
        raise TypeError(f"gpu must be a GPU type, a list of them, 'any' or None, not {type(gpu).__name__}")
    strings: list[str] = []
    for entry in entries:
        if not isinstance(entry, str):
            raise TypeError(f"gpu entries must be strings, not {type(entry).__name__} ({entry!r})")
        strings.append(entry)
    return strings


def _check_fallback_after(fallback_after: object, *, wants_gpu: bool, fallback_cpu: bool) -> None:
    """``fallback_after=`` is a number of seconds, for a GPU job with a CPU fallback."""
    if isinstance(fallback_after, bool) or not isinstance(fallback_after, int | float):
        raise TypeError(f"fallback_after must be a number of seconds, not {fallback_after!r}")
    if not math.isfinite(fallback_after) or fallback_after < 0:
        raise ValueError(f"fallback_after must be zero or more seconds, not {fallback_after!r}")
    if not wants_gpu:
        raise ValueError("fallback_after was given without a gpu; a CPU job has nothing to wait for")
    if not fallback_cpu:
        raise ValueError('fallback_after has no effect without a CPU fallback (fallback=["cpu"])')


def _count(gpu_count: object, *, wants_gpu: bool) -> int:
    """``gpu_count=``, checked; left out: 1 for a GPU job, 0 for a CPU one."""
    if gpu_count is None:
        return 1 if wants_gpu else 0
    if isinstance(gpu_count, bool) or not isinstance(gpu_count, int):
        raise TypeError(f"gpu_count must be an integer, not {gpu_count!r}")
    if not wants_gpu:
        if gpu_count != 0:
            raise ValueError(f"gpu_count={gpu_count} was given without a gpu; name a GPU type or 'any'")
    elif gpu_count not in ALLOWED_GPU_COUNTS:
        raise ValueError(_count_message(gpu_count))
    return gpu_count
