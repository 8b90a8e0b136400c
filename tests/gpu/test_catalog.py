"""The GPU catalog: canonical names, loose spelling, and helpful errors for names it does not know."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.gpu import CATALOG, AmbiguousGpuType, UnknownGpuType, canonical, names, parse_gpu, suggest
from levers9.gpu.catalog import key

REQUIRED = [
    "T4",
    "L4",
    "A10",
    "A10G",
    "A40",
    "A100-40",
    "A100-80",
    "H100",
    "H200",
    "GH200",
    "B200",
    "L40",
    "L40S",
    "A6000",
    "RTX4090",
    "RTX5090",
    "V100",
    "V100-32",
    "MI300X",
]

ALL_SPELLINGS = sorted({s for gpu in CATALOG.values() for s in (gpu.name, *gpu.aliases)})


def test_names_are_in_catalog_order_and_cover_the_required_types() -> None:
    assert names() == list(CATALOG)
    assert set(REQUIRED) <= set(names())
    # every entry is filed under its own name
    assert all(name == gpu.name for name, gpu in CATALOG.items())


@pytest.mark.parametrize(
    ("name", "mib"),
    [
        ("T4", 16384),
        ("L4", 24576),
        ("A10G", 24576),
        ("A100-40", 40960),
        ("A100-80", 81920),
        ("H100", 81920),
        ("H200", 144384),
        ("GH200", 98304),
        ("B200", 184320),
        ("L40S", 49152),
        ("RTX4090", 24576),
        ("RTX5090", 32768),
        ("V100", 16384),
        ("V100-32", 32768),
        ("MI300X", 196608),
    ],
)
def test_memory_figures(name: str, mib: int) -> None:
    assert CATALOG[name].memory_mib == mib


def test_vendors() -> None:
    assert CATALOG["MI300X"].vendor == "amd"
    assert {gpu.vendor for name, gpu in CATALOG.items() if name != "MI300X"} == {"nvidia"}


def test_gpu_type_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        CATALOG["H100"].memory_mib = 1  # type: ignore[misc]


def test_every_spelling_belongs_to_one_type() -> None:
    owners: dict[str, str] = {}
    for gpu in CATALOG.values():
        for spelling in (gpu.name, *gpu.aliases):
            assert owners.setdefault(key(spelling), gpu.name) == gpu.name, spelling


@pytest.mark.parametrize("name", REQUIRED)
def test_canonical_names_are_their_own_canonical(name: str) -> None:
    assert canonical(name) == name
    assert canonical(name.lower()) == name


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("h100", "H100"),
        ("a100-80gb", "A100-80"),
        ("A100_80", "A100-80"),
        ("a100 40", "A100-40"),
        ("A100-SXM4-40GB", "A100-40"),
        ("rtx 4090", "RTX4090"),
        ("geforce rtx 5090", "RTX5090"),
        ("rtx a6000", "A6000"),
        ("Tesla T4", "T4"),
        ("tesla v100", "V100"),
        ("v100_32gb", "V100-32"),
        ("V100S", "V100-32"),
        ("h100 nvl", "H100-NVL"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("H100-PCIe", "H100"),
        ("rtx 3090", "RTX3090"),
        ("NVIDIA GeForce RTX 3090", "RTX3090"),
        ("RTX 6000 Ada", "RTX6000-Ada"),
        ("RTX 6000Ada", "RTX6000-Ada"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX6000-Ada"),
        ("h200-141gb", "H200"),
        ("gh200 480gb", "GH200"),
        ("instinct mi300x", "MI300X"),
        ("  l40s  ", "L40S"),
    ],
)
def test_aliases_and_loose_spelling(written: str, expected: str) -> None:
    assert canonical(written) == expected


@pytest.mark.parametrize("written", ["A100", "a100", "A100-SXM4", "a100 pcie"])
def test_bare_a100_is_ambiguous(written: str) -> None:
    with pytest.raises(AmbiguousGpuType) as info:
        canonical(written)
    error = info.value
    assert isinstance(error, UnknownGpuType)
    assert isinstance(error, ValueError)
    assert error.name == written
    assert error.suggestions == ["A100-40", "A100-80"]
    assert "A100-40" in str(error)
    assert "A100-80" in str(error)
    assert "ambiguous" in str(error)


def test_unknown_name_lists_the_closest() -> None:
    with pytest.raises(UnknownGpuType) as info:
        canonical("H10O")
    error = info.value
    assert error.name == "H10O"
    assert error.suggestions[0] == "H100"
    assert "did you mean H100" in str(error)
    assert "known types:" in str(error)


def test_unknown_name_without_any_close_match_still_lists_the_catalog() -> None:
    with pytest.raises(UnknownGpuType) as info:
        canonical("zzzzzz")
    assert info.value.suggestions == []
    assert "did you mean" not in str(info.value)
    assert "MI300X" in str(info.value)


@pytest.mark.parametrize(
    ("written", "first"),
    [
        ("H1", "H100"),
        ("A100-80GB-SXM4", "A100-80"),
        ("L40X", "L40"),
        ("MI300", "MI300X"),
        ("H20O", "H200"),
        ("B20", "B200"),
    ],
)
def test_suggest_puts_the_likely_name_first(written: str, first: str) -> None:
    assert suggest(written)[0] == first


def test_suggest_prefix_finds_every_type_it_begins() -> None:
    # the RTX A6000 is an RTX too
    assert set(suggest("RTX", n=10)) == {"A6000", "RTX6000-Ada", "RTX3090", "RTX4090", "RTX5090", "RTXPRO6000"}
    assert suggest("A100")[:2] == ["A100-40", "A100-80"]


def test_suggest_limits() -> None:
    assert len(suggest("A", n=3)) == 3
    assert len(suggest("A", n=1)) == 1
    assert suggest("A", n=0) == []
    assert suggest("") == []
    assert suggest(" - _ ") == []


def _respell(spelling: str, data: st.DataObject) -> str:
    """The same name written differently: case flipped, separators swapped, spaces added around."""
    out = []
    for char in spelling:
        if char in "-_ ":
            out.append(data.draw(st.sampled_from(["-", "_", " ", "", "--"])))
        else:
            out.append(char.upper() if data.draw(st.booleans()) else char.lower())
    return data.draw(st.sampled_from(["", " "])) + "".join(out) + data.draw(st.sampled_from(["", " "]))


@given(spelling=st.sampled_from(ALL_SPELLINGS), data=st.data())
def test_canonical_is_idempotent_over_every_spelling(spelling: str, data: st.DataObject) -> None:
    written = _respell(spelling, data)
    name = canonical(written)
    assert name in CATALOG
    assert canonical(name) == name
    assert canonical(spelling) == name


@given(st.text(max_size=40))
def test_canonical_returns_a_catalog_name_or_raises_unknown(text: str) -> None:
    error: UnknownGpuType | None = None
    try:
        name = canonical(text)
    except UnknownGpuType as raised:
        error = raised
    if error is None:
        assert name in CATALOG
    else:
        assert error.name == text
        assert all(s in CATALOG for s in error.suggestions)
        assert len(error.suggestions) <= 3


def test_the_marketplace_cards_are_types_of_their_own_with_their_real_memory() -> None:
    # Issue 38: RunPod and Vast.ai rent these; the H100 NVL was counted as an 80 GB H100
    assert {n: (CATALOG[n].memory_mib, CATALOG[n].vendor) for n in ("RTX3090", "RTX6000-Ada", "H100-NVL")} == {
        "RTX3090": (24 * 1024, "nvidia"),
        "RTX6000-Ada": (48 * 1024, "nvidia"),
        "H100-NVL": (94 * 1024, "nvidia"),
    }
    assert CATALOG["H100"].memory_mib == 80 * 1024
    # a request for an H100 means the 80 GB card; one that would run on either names both
    assert parse_gpu("H100").types == ("H100",)
    assert parse_gpu(["H100", "H100-NVL"]).types == ("H100", "H100-NVL")
    # neighbours that are not these cards stay apart
    assert canonical("RTX A6000") == "A6000"
    with pytest.raises(UnknownGpuType):
        canonical("Quadro RTX 6000")
