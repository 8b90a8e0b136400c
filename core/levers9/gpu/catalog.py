"""The canonical GPU types: the one vocabulary every part of levers9 speaks.

Users, providers, drivers and Kubernetes all spell the same GPU differently
(``H100``, ``NVIDIA H100 80GB HBM3``, ``nvidia-h100-80gb``, ``gpu_8x_h100_sxm5``).
The scheduler can only match a request to an offer when both use the same
word, so every name is brought to one of the canonical names below before it
is compared, stored or shown.

A canonical type names what a job can rely on, not the exact SKU: GPUs that
differ only in form factor or interconnect (SXM or PCIe) share a type, while
GPUs whose memory differs enough to decide whether a model fits (A100 40 GB and
80 GB, V100 16 GB and 32 GB, H100 80 GB and the 94 GB H100 NVL) get a type each.

A type means its memory, not "at least" it: ``H100`` is the 80 GB GH100 card,
and a request for ``H100`` never lands on an ``H100-NVL`` (94 GB, priced
apart), nor an ``H100-NVL`` pool's offers on an ``H100`` pool. A job that
would run on either says so: ``gpu=["H100", "H100-NVL"]``. The same figure is
what a provider's ``GpuOffer.gpu_memory_mib`` is checked against, per GPU, so
an offer of a bigger card under a smaller type's name is a provider's bug.

Memory figures
--------------
``memory_mib`` is the vendor's nominal capacity with its "GB" read as GiB
(80 GB -> 81920 MiB), which is also what EC2's ``DescribeInstanceTypes``
reports. The driver always shows a little less, because it reserves some for
itself: ``nvidia-smi`` reports 81559 MiB for an H100 80GB HBM3, 143771 MiB for
an H200, 15360 MiB for a T4, 40960 MiB for an A100 40GB. Code that compares a
measured figure with the catalog must therefore use thresholds, never equality.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

__all__ = [
    "CATALOG",
    "AmbiguousGpuType",
    "GpuType",
    "UnknownGpuType",
    "canonical",
    "gpu_memory_mib",
    "key",
    "names",
    "suggest",
]


@dataclass(frozen=True)
class GpuType:
    """One canonical GPU type."""

    #: the canonical name, as written in config and shown to users
    name: str
    #: ``nvidia`` or ``amd``
    vendor: str
    #: nominal memory of one GPU (see the module docstring for how it compares with the driver's figure)
    memory_mib: int
    #: other names a user may write for it; matched like the name (case, ``-``, ``_`` and spaces ignored)
    aliases: tuple[str, ...] = ()
    description: str = ""


def _gib(n: int) -> int:
    return n * 1024


_TYPES: tuple[GpuType, ...] = (
    GpuType("T4", "nvidia", _gib(16), ("Tesla T4",), "Turing, 16 GB GDDR6; inference"),
    GpuType("L4", "nvidia", _gib(24), (), "Ada Lovelace, 24 GB GDDR6; inference"),
    GpuType("A10", "nvidia", _gib(24), (), "Ampere, 24 GB GDDR6"),
    GpuType(
        "A10G",
        "nvidia",
        _gib(24),
        (),
        "Ampere, 24 GB GDDR6; the AWS variant of the A10 (g5 instances)",
    ),
    GpuType("A40", "nvidia", _gib(48), (), "Ampere, 48 GB GDDR6"),
    GpuType(
        "A100-40",
        "nvidia",
        _gib(40),
        ("A100-40GB", "A100-SXM4-40GB", "A100-PCIE-40GB"),
        "Ampere, 40 GB HBM2 (SXM4 or PCIe)",
    ),
    GpuType(
        "A100-80",
        "nvidia",
        _gib(80),
        ("A100-80GB", "A100-SXM4-80GB", "A100-PCIE-80GB"),
        "Ampere, 80 GB HBM2e (SXM4 or PCIe)",
    ),
    GpuType(
        "H100",
        "nvidia",
        _gib(80),
        ("H100-80GB", "H100-SXM", "H100-SXM5", "H100-PCIE", "H100-MEGA"),
        "Hopper, 80 GB HBM3 (SXM5 or PCIe)",
    ),
    # The same GH100 chip as the H100 with 94 GB: once folded into H100, it is its own type because a type
    # means its memory (see the module docstring) and marketplaces price it apart. nvidia-smi: "NVIDIA H100 NVL",
    # 95830 MiB.
    GpuType(
        "H100-NVL",
        "nvidia",
        _gib(94),
        ("H100-NVL-94GB", "H100-94GB", "NVIDIA-H100-NVL"),
        "Hopper, 94 GB HBM3, PCIe card (pairs joined by NVLink)",
    ),
    GpuType(
        "H200",
        "nvidia",
        _gib(141),
        ("H200-141GB", "H200-SXM", "H200-NVL"),
        "Hopper, 141 GB HBM3e (nvidia-smi shows 143771 MiB)",
    ),
    # The 96 GB HBM3 superchip is the one clouds rent (Lambda's gpu_1x_gh200). The
    # "480GB" in nvidia-smi's name counts the Grace CPU's LPDDR5X as well.
    GpuType(
        "GH200",
        "nvidia",
        _gib(96),
        ("GH200-96GB", "GH200-480GB"),
        "Grace Hopper superchip, 96 GB HBM3 on the GPU",
    ),
    # NVIDIA sells the HGX/DGX B200 as 180 GB per GPU (the die carries 192 GB; the
    # driver shows about 179 GiB), so 180 is the figure that matches offers.
    GpuType(
        "B200",
        "nvidia",
        _gib(180),
        ("B200-180GB", "B200-SXM", "B200-SXM6"),
        "Blackwell, 180 GB HBM3e",
    ),
    # 288 GB (decimal) of HBM3e per GPU; EC2's p6-b300 reports 275040 MiB, the same figure.
    GpuType("B300", "nvidia", 275040, ("B300-288GB", "B300-SXM"), "Blackwell Ultra, 288 GB HBM3e"),
    GpuType("L40", "nvidia", _gib(48), (), "Ada Lovelace, 48 GB GDDR6"),
    GpuType("L40S", "nvidia", _gib(48), (), "Ada Lovelace, 48 GB GDDR6; training and inference"),
    GpuType("A6000", "nvidia", _gib(48), ("RTX-A6000",), "Ampere workstation (RTX A6000), 48 GB GDDR6"),
    # Not the RTX A6000 (Ampere, above) nor the Quadro RTX 6000 (Turing, 24 GB, not in the catalog): a bare
    # "RTX 6000" names neither. nvidia-smi: "NVIDIA RTX 6000 Ada Generation"; Vast.ai: "RTX 6000Ada".
    GpuType(
        "RTX6000-Ada",
        "nvidia",
        _gib(48),
        ("RTX-6000-Ada-Generation", "NVIDIA-RTX-6000-Ada-Generation"),
        "Ada Lovelace workstation card, 48 GB GDDR6",
    ),
    # Marketplaces (RunPod, Vast.ai) rent consumer and workstation cards by nvidia-smi's names.
    GpuType(
        "RTX3090",
        "nvidia",
        _gib(24),
        ("GeForce-RTX-3090", "NVIDIA-GeForce-RTX-3090"),
        "Ampere consumer card, 24 GB GDDR6X (not the 3090 Ti)",
    ),
    GpuType("RTX4090", "nvidia", _gib(24), ("GeForce-RTX-4090",), "Ada Lovelace consumer card, 24 GB GDDR6X"),
    GpuType("RTX5090", "nvidia", _gib(32), ("GeForce-RTX-5090",), "Blackwell consumer card, 32 GB GDDR7"),
    # EC2's g7e names it "RTX PRO Server 6000"; nvidia-smi says "NVIDIA RTX PRO 6000 Blackwell Server Edition".
    GpuType(
        "RTXPRO6000",
        "nvidia",
        _gib(96),
        ("RTX-PRO-6000", "RTX-PRO-Server-6000", "RTX-PRO-6000-Blackwell", "RTX-PRO-6000-Blackwell-Server-Edition"),
        "Blackwell workstation and server card, 96 GB GDDR7",
    ),
    # V100 without a size means the 16 GB card: it is what p3 (but p3dn), OCI's
    # GPU3 shapes, GKE's nvidia-tesla-v100 and Lambda's gpu_8x_v100 provide.
    GpuType(
        "V100",
        "nvidia",
        _gib(16),
        ("V100-16", "V100-16GB", "Tesla V100", "V100-SXM2-16GB", "V100-PCIE-16GB"),
        "Volta, 16 GB HBM2",
    ),
    GpuType(
        "V100-32",
        "nvidia",
        _gib(32),
        ("V100-32GB", "V100-SXM2-32GB", "V100-PCIE-32GB", "V100S"),
        "Volta, 32 GB HBM2 (p3dn.24xlarge, DGX-1/2); the V100S counts as one",
    ),
    GpuType(
        "MI300X",
        "amd",
        _gib(192),
        ("Instinct MI300X", "AMD-MI300X"),
        "AMD CDNA 3, 192 GB HBM3",
    ),
)

#: canonical name -> type, in the order listings show them
CATALOG: dict[str, GpuType] = {t.name: t for t in _TYPES}

# Names that denote more than one canonical type. Guessing would put a job that
# needs 80 GB on a 40 GB card (or pay for 80 GB when 40 would do), so ask instead.
_AMBIGUOUS: dict[str, tuple[str, ...]] = {
    "A100": ("A100-40", "A100-80"),
    "A100SXM4": ("A100-40", "A100-80"),
    "A100PCIE": ("A100-40", "A100-80"),
    "TESLAA100": ("A100-40", "A100-80"),
}

_SEPARATORS = re.compile(r"[\s_\-]+")


def key(name: str) -> str:
    """The comparison key of a name: upper case with spaces, ``-`` and ``_`` removed.

    Users write ``a100-80``, ``A100_80`` and ``A100 80`` for the same thing and
    none of those differences carries meaning, so they are erased before any lookup.
    """
    return _SEPARATORS.sub("", name).upper()


def _build_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for gpu in _TYPES:
        for spelling in (gpu.name, *gpu.aliases):
            k = key(spelling)
            other = index.get(k)
            if other is not None and other != gpu.name:  # pragma: no cover - guards edits to the table
                raise RuntimeError(f"GPU name {spelling!r} is claimed by both {other} and {gpu.name}")
            index[k] = gpu.name
    for k in _AMBIGUOUS:
        if k in index:  # pragma: no cover - guards edits to the table
            raise RuntimeError(f"{k!r} is both a GPU name and an ambiguous one")
    return index


_INDEX: dict[str, str] = _build_index()


class UnknownGpuType(ValueError):
    """A GPU name that is not in the catalog, with the closest names that are.

    A ``ValueError`` so that pydantic validators and config loaders that already
    report ``ValueError`` as a user mistake handle it without special cases.
    """

    def __init__(self, name: str, suggestions: list[str], message: str | None = None) -> None:
        self.name = name
        self.suggestions = suggestions
        if message is None:
            message = f"unknown GPU type {name!r}"
            if suggestions:
                message += f"; did you mean {_or_list(suggestions)}?"
            message += f" (known types: {', '.join(CATALOG)})"
        super().__init__(message)


class AmbiguousGpuType(UnknownGpuType):
    """A name that fits more than one canonical type (a bare ``A100``); ``suggestions`` lists them all."""

    def __init__(self, name: str, candidates: list[str]) -> None:
        message = (
            f"GPU type {name!r} is ambiguous: pick {_or_list(candidates)}"
            " (they differ in memory, which decides whether a model fits)"
        )
        super().__init__(name, candidates, message)


def _or_list(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " or " + items[-1]


def names() -> list[str]:
    """Every canonical name, in catalog order."""
    return list(CATALOG)


def canonical(name: str) -> str:
    """Return the canonical name for ``name`` (a canonical name or an alias, spelt loosely).

    :raises AmbiguousGpuType: ``name`` fits several types (``A100``).
    :raises UnknownGpuType: ``name`` fits none; the error lists the closest names.
    """
    k = key(name)
    found = _INDEX.get(k)
    if found is not None:
        return found
    if k in _AMBIGUOUS:
        raise AmbiguousGpuType(name, list(_AMBIGUOUS[k]))
    raise UnknownGpuType(name, suggest(name))


def suggest(name: str, n: int = 3) -> list[str]:
    """The up to ``n`` canonical names closest to ``name``, best first.

    Prefix matches come first because a truncated name (``A100``, ``H1``,
    ``RTX``) is the commonest mistake and difflib ranks those poorly; fuzzy
    matches on the comparison keys follow for typos (``H10O``, ``L40X``).
    """
    if n <= 0:
        return []
    k = key(name)
    if not k:
        return []
    out: list[str] = []

    def add(candidate: str) -> None:
        if candidate not in out:
            out.append(candidate)

    for candidate in _AMBIGUOUS.get(k, ()):
        add(candidate)
    # A truncated name ("A100", "H1", "RTX"): every type one of whose spellings it begins.
    for spelling, target in _INDEX.items():
        if spelling.startswith(k):
            add(target)
    # A name with something extra ("H100X", "A100-80GB-SXM4"): the longest spelling it begins with.
    longest = max((s for s in _INDEX if k.startswith(s)), key=len, default=None)
    if longest is not None:
        add(_INDEX[longest])
    for spelling in difflib.get_close_matches(k, list(_INDEX), n=max(n * 3, 6), cutoff=0.5):
        add(_INDEX[spelling])
    return out[:n]


def gpu_memory_mib(name: str) -> int:
    """The catalog's memory of one GPU of type ``name`` (any spelling :func:`canonical` takes), in MiB.

    What a provider puts in ``GpuOffer.gpu_memory_mib`` when its API does not say; the nominal figure, so a
    measured one (``nvidia-smi``'s) is a little less (see the module docstring).

    :raises AmbiguousGpuType: ``name`` fits several types (``A100``).
    :raises UnknownGpuType: ``name`` fits none; the error lists the closest names.
    """
    return CATALOG[canonical(name)].memory_mib
