"""Bring every spelling of a GPU that levers9 meets to a canonical type.

Each source names GPUs its own way: the driver (``NVIDIA H100 80GB HBM3``), GPU
feature discovery on Kubernetes (``NVIDIA-H100-80GB-HBM3``), GKE
(``nvidia-h100-80gb``), Karpenter (``h100``), EC2 (``H100`` plus a memory
size), OCI (``NVIDIA® H100 80GB Tensor Core``) and Lambda (``H100 (80 GB
SXM5)``). The scheduler can only compare an offer with a request once both say
``H100``, so every provider and discovery plugin goes through here.

These functions describe what they are shown and never raise on input they do
not understand: an unknown or unsupported GPU becomes ``None``, which callers
treat as "a GPU levers9 cannot schedule by type", not as an error. Raising is
left to :func:`levers9.gpu.catalog.canonical`, which checks what *users* write.

How the rules decide
--------------------
The text is cleaned of trademark signs, split into words on spaces and
punctuation, and the first word that is a known model (``H100``, ``L40S``,
``A10G``...) wins, so vendor and marketing words (``NVIDIA``, ``Tesla``,
``Tensor Core``, ``SXM5``, ``HBM3``) need no list of their own and an unknown
model (``A30``, ``H800``, ``Quadro RTX 6000``) falls through to ``None``. A
few models need more than their name:

* ``A100`` is resolved by the memory written next to it (``40GB``, ``80 GB``)
  or, failing that, by the memory size the source reports; with neither it is
  ``None`` rather than a guess;
* ``V100`` is ``V100-32`` when 32 GB is written or reported, else ``V100``
  (16 GB, the common case);
* ``H100`` is ``H100-NVL`` when ``NVL`` follows it (``NVIDIA H100 NVL``, 94
  GB), else ``H100`` (SXM5 or PCIe, 80 GB): a type means its memory (see
  :mod:`levers9.gpu.catalog`);
* after ``RTX``, ``6000`` is the ``RTX6000-Ada`` only when ``Ada`` follows
  (``NVIDIA RTX 6000 Ada Generation``, Vast.ai's ``RTX 6000Ada``): a bare
  ``RTX 6000`` is the Turing Quadro, not in the catalog; and ``3090 Ti`` is
  not the ``RTX3090``.

A MIG slice is never reported as its parent GPU: a ``1g.10gb`` slice of an
A100 has a seventh of its compute and an eighth of its memory, and a job
scheduled onto it because it "is an A100" would not fit. Whole GPUs shared by
time-slicing (GPU feature discovery's ``-SHARED`` suffix) are still whole GPUs
of their type and are reported as such.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from levers9.gpu.catalog import CATALOG, UnknownGpuType, canonical

__all__ = [
    "from_ec2_gpu_info",
    "from_k8s_labels",
    "from_lambda_instance_type",
    "from_nvidia_smi",
    "from_oci_shape",
    "normalize",
]

# --------------------------------------------------------------------------- the shared rules

_MARKS = re.compile(r"[®™©]|\((?:R|TM|C)\)", re.IGNORECASE)
_WORD_SPLIT = re.compile(r"[^A-Z0-9]+")
# "40GB", "80 GB", "144G", "141GiB"; not the "10G" of "A10G" (a letter before the digits).
_MEMORY = re.compile(r"(?<![A-Z0-9.])(\d+(?:\.\d+)?)\s*(?:GIB|GB|G)(?![A-Z0-9])")

# A word that is a model on its own.
_MODEL_WORDS: dict[str, str] = {
    "T4": "T4",
    "L4": "L4",
    "A10": "A10",
    "A10G": "A10G",
    "A40": "A40",
    "L40": "L40",
    "L40S": "L40S",
    "H100": "H100",
    "H200": "H200",
    "GH200": "GH200",
    "B200": "B200",
    "B300": "B300",
    "A6000": "A6000",
    "RTXPRO6000": "RTXPRO6000",
    "RTXA6000": "A6000",
    "RTX3090": "RTX3090",
    "RTX4090": "RTX4090",
    "RTX5090": "RTX5090",
    "RTX6000ADA": "RTX6000-Ada",
    "V100S": "V100-32",
    "MI300X": "MI300X",
}
# Words after "RTX" that complete a model ("RTX 4090", "RTX A6000", Vast.ai's "RTX 6000Ada").
_RTX_SUFFIXES = {"3090", "4090", "5090", "A6000", "6000ADA"}
# Words that mean "not a whole data-centre card of this model", whatever the model word says.
_VETO_WORDS = {"MIG", "LAPTOP", "MOBILE"}

_A100_80_MIN_GIB = 60.0
_V100_32_MIN_GIB = 24.0


def _clean(text: str) -> str:
    return _MARKS.sub(" ", text).upper()


def _words(text: str) -> list[str]:
    return [w for w in _WORD_SPLIT.split(text) if w]


def _written_memory_gib(text: str) -> float | None:
    # Separators become spaces first so "A100-SXM4-40GB" and "a100_80gb_sxm4" expose the size.
    spaced = re.sub(r"[_\-/,()\[\]]+", " ", text)
    match = _MEMORY.search(spaced)
    return float(match.group(1)) if match else None


def _by_memory(model: str, written_gib: float | None, memory_mib: int | None) -> str | None:
    gib = written_gib
    if gib is None and memory_mib is not None and memory_mib > 0:
        gib = memory_mib / 1024
    if model == "A100":
        if gib is None:
            return None
        return "A100-80" if gib >= _A100_80_MIN_GIB else "A100-40"
    # V100
    if gib is not None and gib >= _V100_32_MIN_GIB:
        return "V100-32"
    return "V100"


def _model_from_text(text: str, memory_mib: int | None = None) -> str | None:
    """The canonical type named somewhere in ``text``, by the rules in the module docstring."""
    cleaned = _clean(text)
    words = _words(cleaned)
    if _VETO_WORDS.intersection(words):
        return None
    for i, word in enumerate(words):
        after = words[i + 1 : i + 3]
        if word in ("RTX", "RTX3090") and "TI" in words[i + 1 : i + 3]:
            return None  # the 3090 Ti (and any other Ti) is a card of its own, not in the catalog
        if word == "RTX" and after[:1] == ["6000"]:
            return "RTX6000-Ada" if after[1:] == ["ADA"] else None  # a bare "RTX 6000" is the Turing Quadro
        if word == "RTX" and after[:1] and after[0] in _RTX_SUFFIXES:
            return _MODEL_WORDS["RTX" + after[0]]
        if word == "H100" and "NVL" in after[:1]:
            return "H100-NVL"
        if word == "RTX" and words[i + 1 : i + 2] == ["PRO"]:
            # "RTX PRO 6000 Blackwell Server Edition", EC2's "RTX PRO Server 6000"; other RTX PRO cards
            # (4500, 5000) are not in the catalog
            return "RTXPRO6000" if "6000" in words[i + 2 : i + 4] else None
        if word in _MODEL_WORDS:
            return _MODEL_WORDS[word]
        if word in ("A100", "V100"):
            return _by_memory(word, _written_memory_gib(cleaned), memory_mib)
    return None


def _int(value: Any) -> int | None:
    """An integer read from a label, a JSON number or a numeric string; None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            try:
                as_float = float(value.strip())
            except ValueError:
                return None
            return int(as_float) if as_float.is_integer() else None
    return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


# --------------------------------------------------------------------------- the driver


def from_nvidia_smi(name: str, memory_mib: int | None = None) -> str | None:
    """The canonical type of a GPU as ``nvidia-smi --query-gpu=name`` (or NVML) names it.

    ``memory_mib`` (``memory.total``) settles names that do not carry their size,
    such as a bare ``A100``.
    """
    if not isinstance(name, str):
        return None
    return _model_from_text(name, memory_mib)


# --------------------------------------------------------------------------- Kubernetes node labels

# GKE's accelerator names form a closed set whose meaning is documented rather
# than spelt out in the name ("nvidia-tesla-a100" is the 40 GB card).
_GKE_ACCELERATORS: dict[str, str | None] = {
    "nvidia-tesla-t4": "T4",
    "nvidia-l4": "L4",
    "nvidia-tesla-v100": "V100",
    "nvidia-tesla-a100": "A100-40",
    "nvidia-a100-80gb": "A100-80",
    "nvidia-h100-80gb": "H100",
    "nvidia-h100-mega-80gb": "H100",
    "nvidia-h200-141gb": "H200",
    "nvidia-b200": "B200",
    "nvidia-tesla-k80": None,
    "nvidia-tesla-p4": None,
    "nvidia-tesla-p100": None,
    "nvidia-gb200": None,
    "nvidia-rtx-pro-6000": None,
}

_GFD_PRODUCT = "nvidia.com/gpu.product"
_GFD_MEMORY = "nvidia.com/gpu.memory"
_GFD_COUNT = "nvidia.com/gpu.count"
_GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
_GKE_PARTITION = "cloud.google.com/gke-gpu-partition-size"
_KARPENTER_NAME = "karpenter.k8s.aws/instance-gpu-name"
_KARPENTER_MEMORY = "karpenter.k8s.aws/instance-gpu-memory"
_KARPENTER_COUNT = "karpenter.k8s.aws/instance-gpu-count"
_AMD_PRODUCT = "amd.com/gpu.product-name"
_MIG_RESOURCE_COUNT = re.compile(r"^nvidia\.com/mig-[^/]+\.count$")


def _is_mig(labels: Mapping[str, str]) -> bool:
    """Whether the node's GPUs are cut into MIG slices (so it has no whole GPU to offer by type).

    Any one of the signs is enough: GFD's "single" strategy rewrites the product
    (``...-MIG-1g.5gb``), its "mixed" strategy adds per-profile counts, the MIG
    manager records the layout it applied, and GKE labels the partition size.
    """
    product = labels.get(_GFD_PRODUCT)
    if isinstance(product, str) and "MIG" in _words(_clean(product)):
        return True
    for label, value in labels.items():
        if _MIG_RESOURCE_COUNT.match(label) and (_int(value) or 0) > 0:
            return True
    mig_config = labels.get("nvidia.com/mig.config")
    if mig_config and mig_config != "all-disabled" and labels.get("nvidia.com/mig.config.state") == "success":
        return True
    return bool(_str(labels.get(_GKE_PARTITION)))


def from_k8s_labels(labels: Mapping[str, str]) -> tuple[str | None, int]:
    """The canonical type and the number of whole GPUs of a Kubernetes node, from its labels.

    Sources are tried from the most to the least precise: GPU feature discovery
    (it asks the driver), then Karpenter, GKE and the AMD node labeller (they
    describe the instance type). The count is GPU feature discovery's
    ``nvidia.com/gpu.count``, else Karpenter's ``instance-gpu-count``, else 0
    (GKE and the AMD labeller put the count in the node's capacity, not its
    labels). A node whose GPUs are MIG-partitioned is ``(None, 0)``: it has no
    whole GPU to offer (see the module docstring).
    """
    if not isinstance(labels, Mapping):
        return None, 0
    if _is_mig(labels):
        return None, 0
    count = _int(labels.get(_GFD_COUNT))
    if count is None:
        count = _int(labels.get(_KARPENTER_COUNT))
    count = max(count or 0, 0)

    gpu: str | None = None
    product = _str(labels.get(_GFD_PRODUCT))
    if product is not None:
        gpu = _model_from_text(product, _int(labels.get(_GFD_MEMORY)))
    if gpu is None and (karpenter := _str(labels.get(_KARPENTER_NAME))) is not None:
        gpu = _model_from_text(karpenter, _int(labels.get(_KARPENTER_MEMORY)))
    if gpu is None and (gke := _str(labels.get(_GKE_ACCELERATOR))) is not None:
        key = gke.strip().lower()
        gpu = _GKE_ACCELERATORS[key] if key in _GKE_ACCELERATORS else _model_from_text(gke)
    if gpu is None and (amd := _str(labels.get(_AMD_PRODUCT))) is not None:
        gpu = _model_from_text(amd)
    return gpu, count


# --------------------------------------------------------------------------- cloud APIs


#: below this share of the catalog's memory, a reported GPU is a slice, not the whole card
_WHOLE_GPU_SHARE = 0.85


def from_ec2_gpu_info(gpu_info: Mapping[str, Any]) -> tuple[str | None, int]:
    """The canonical type and GPU count of an EC2 instance type, from ``DescribeInstanceTypes``.

    Takes the ``GpuInfo`` structure (or a whole instance-type entry holding one).
    EC2 names the A100 and V100 without their size, so ``MemoryInfo.SizeInMiB``
    decides between A100-40 and A100-80, and V100 and V100-32. An entry without
    ``GpuInfo`` (inf2, trn1, every CPU type) is ``(None, 0)``; GPUs not in the
    catalog (M60, K80, T4g, Radeon Pro V520) give ``None`` with their count.
    """
    if not isinstance(gpu_info, Mapping):
        return None, 0
    if "GpuInfo" in gpu_info:
        inner = gpu_info.get("GpuInfo")
        if not isinstance(inner, Mapping):
            return None, 0
        gpu_info = inner
    entries = gpu_info.get("Gpus")
    if not isinstance(entries, list):
        return None, 0
    types: set[str | None] = set()
    total = 0
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        name = _str(entry.get("Name"))
        memory_info = entry.get("MemoryInfo")
        memory = _int(memory_info.get("SizeInMiB")) if isinstance(memory_info, Mapping) else None
        types.add(_model_from_text(name, memory) if name is not None else None)
        total += max(_int(entry.get("Count")) or 0, 0)
    # EC2 has no instance type mixing GPU models; if one appears, refuse to call it either.
    gpu = next(iter(types)) if len(types) == 1 else None
    if gpu is not None and memory is not None and memory < CATALOG[gpu].memory_mib * _WHOLE_GPU_SHARE:
        # A fraction of a GPU (g6f sells an eighth of an L4 as 2861 MiB): like a MIG slice,
        # it is not the GPU type a job asked for.
        return None, total
    return gpu, total


# OCI's first GPU shapes carry a generation number instead of the model.
_OCI_GENERATIONS: dict[str, str | None] = {
    "GPU2": None,  # P100
    "GPU3": "V100",  # 16 GB
    "GPU4": "A100-40",
}
# Shape models whose name does not say the memory that tells them apart.
_OCI_MODELS: dict[str, str] = {
    "A100-V2": "A100-80",
}
_OCI_SHAPE = re.compile(r"^(?:BM|VM)\.(GPU\d*)(?:\.(.+))?\.(\d+)$", re.IGNORECASE)


def _first(mapping: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if k in mapping and mapping[k] is not None:
            return mapping[k]
    return None


def from_oci_shape(shape: Mapping[str, Any]) -> tuple[str | None, int]:
    """The canonical type and GPU count of an OCI compute shape, from ``ListShapes``.

    Accepts the REST API's camelCase keys (``gpuDescription``), the CLI's
    kebab-case ones (``gpu-description``) and the Python SDK's snake_case.
    ``gpuDescription`` is read first; the shape name is the fallback, which is
    the only source for the generation-numbered shapes (``BM.GPU4.8`` is eight
    A100 40 GB). ``gpuMemoryInGBs``, where present, is taken as the shape's total
    and divided by the GPU count.
    """
    if not isinstance(shape, Mapping):
        return None, 0
    name = _str(_first(shape, "shape", "shapeName", "shape-name", "shape_name")) or ""
    match = _OCI_SHAPE.match(name.strip())
    count = _int(_first(shape, "gpus"))
    if count is None and match is not None:
        count = int(match.group(3))
    count = max(count or 0, 0)

    memory_mib: int | None = None
    memory_gb = _first(shape, "gpuMemoryInGBs", "gpu-memory-in-gbs", "gpu_memory_in_gbs")
    if (
        isinstance(memory_gb, int | float)
        and not isinstance(memory_gb, bool)
        and math.isfinite(memory_gb)
        and memory_gb > 0
    ):
        memory_mib = int(memory_gb * 1024 / (count or 1))

    gpu: str | None = None
    description = _str(_first(shape, "gpuDescription", "gpu-description", "gpu_description"))
    if description is not None:
        gpu = _model_from_text(description, memory_mib)
    if gpu is None and match is not None:
        generation, model = match.group(1).upper(), (match.group(2) or "").upper()
        if not model:
            gpu = _OCI_GENERATIONS.get(generation)
        elif model in _OCI_MODELS:
            gpu = _OCI_MODELS[model]
        else:
            gpu = _model_from_text(model, memory_mib)
    if count == 0 and gpu is None:
        return None, 0
    return gpu, count


_LAMBDA_COUNT = re.compile(r"(?:^|[_\s])(\d+)X(?:[_\s]|$)", re.IGNORECASE)


def from_lambda_instance_type(item: Mapping[str, Any]) -> tuple[str | None, int]:
    """The canonical type and GPU count of a Lambda Cloud instance type.

    Accepts an entry of ``GET /api/v1/instance-types`` (``{"instance_type": {...},
    "regions_with_capacity_available": [...]}``) or the inner ``instance_type``.
    ``gpu_description`` (``H100 (80 GB SXM5)``) is read first, then
    ``description``, then the name (``gpu_8x_a100_80gb_sxm4``); the count comes
    from ``specs.gpus``, else from the ``8x`` in the name.
    """
    if not isinstance(item, Mapping):
        return None, 0
    inner = item.get("instance_type")
    instance_type: Mapping[str, Any] = inner if isinstance(inner, Mapping) else item
    name = _str(instance_type.get("name")) or ""

    specs = instance_type.get("specs")
    count = _int(specs.get("gpus")) if isinstance(specs, Mapping) else None
    if count is None:
        for text in (name, _str(instance_type.get("description")) or ""):
            if match := _LAMBDA_COUNT.search(text):
                count = int(match.group(1))
                break
    count = max(count or 0, 0)

    gpu: str | None = None
    for source in (
        _str(instance_type.get("gpu_description")),
        _str(instance_type.get("description")),
        name or None,
    ):
        if source is not None and (gpu := _model_from_text(source)) is not None:
            break
    return gpu, count


# --------------------------------------------------------------------------- anything


def normalize(name: str) -> str | None:
    """Best-effort canonical type of a free-form GPU name; None when it names no GPU levers9 knows.

    Tries the catalog's own names and aliases first (so ``a100-80`` and
    ``rtx 4090`` work), then GKE accelerator names, then the driver and
    Kubernetes label rules. A name the catalog calls ambiguous (``A100``) is
    ``None`` here: this function is for reading what machines report, and a
    report that cannot be pinned down must not be guessed.
    """
    if not isinstance(name, str):
        return None
    try:
        return canonical(name)
    except UnknownGpuType:
        pass
    gke = _GKE_ACCELERATORS.get(name.strip().lower(), "")
    if gke != "":
        return gke
    return _model_from_text(name)
