"""``levers9.gpu.catalog.gpu_memory_mib``: how a plugin reads a GPU type's memory from the catalog, by any spelling."""

from __future__ import annotations

import pytest

from levers9.gpu.catalog import CATALOG, AmbiguousGpuType, UnknownGpuType, gpu_memory_mib


def test_memory_of_a_canonical_name_and_of_its_aliases() -> None:
    assert gpu_memory_mib("H100") == 80 * 1024
    assert gpu_memory_mib("a100-80gb") == 80 * 1024
    assert gpu_memory_mib("Tesla T4") == 16 * 1024
    assert all(gpu_memory_mib(name) == gpu.memory_mib for name, gpu in CATALOG.items())


def test_an_unknown_or_ambiguous_name_is_refused_with_the_closest_names() -> None:
    with pytest.raises(AmbiguousGpuType, match="A100-40 or A100-80"):
        gpu_memory_mib("A100")
    with pytest.raises(UnknownGpuType, match="did you mean H100"):
        gpu_memory_mib("H10")
