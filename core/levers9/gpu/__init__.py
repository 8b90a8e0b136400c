"""GPU types: the catalog, reading GPU names from every source, and job GPU preferences.

Everything here is pure data and string handling (stdlib and pydantic only),
because the SDK, the scheduler, the CLI and every provider plugin import it and
none of them should pay for more.

Note that ``levers9.gpu.normalize`` is the *function* once this package is
imported; import the module's other helpers with
``from levers9.gpu.normalize import from_nvidia_smi`` (or from here).
"""

from levers9.gpu.catalog import (
    CATALOG,
    AmbiguousGpuType,
    GpuType,
    UnknownGpuType,
    canonical,
    names,
    suggest,
)
from levers9.gpu.normalize import (
    from_ec2_gpu_info,
    from_k8s_labels,
    from_lambda_instance_type,
    from_nvidia_smi,
    from_oci_shape,
    normalize,
)
from levers9.gpu.preference import ALLOWED_GPU_COUNTS, GpuRequest, parse_gpu

__all__ = [
    "ALLOWED_GPU_COUNTS",
    "CATALOG",
    "AmbiguousGpuType",
    "GpuRequest",
    "GpuType",
    "UnknownGpuType",
    "canonical",
    "from_ec2_gpu_info",
    "from_k8s_labels",
    "from_lambda_instance_type",
    "from_nvidia_smi",
    "from_oci_shape",
    "names",
    "normalize",
    "parse_gpu",
    "suggest",
]
