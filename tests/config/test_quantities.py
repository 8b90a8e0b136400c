"""The one size and CPU parser that the config and the SDK share (levers9.quantities)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from levers9.quantities import (
    GIB,
    KIB,
    MIB,
    NotAQuantity,
    NotAQuantityType,
    format_bytes,
    parse_bytes,
    parse_cpu_millicores,
    parse_memory_mib,
)


@pytest.mark.parametrize(
    ("value", "mib"),
    [
        (512, 512),
        (512.0, 512),
        ("512", 512),
        ("256Mi", 256),
        ("256M", 256),
        ("1Gi", 1024),
        ("1gi", 1024),
        ("16GiB", 16384),
        ("16GB", 16384),
        ("16G", 16384),
        (" 2 GiB ", 2048),
        ("1.5Gi", 1536),
        ("1TiB", 1024 * 1024),
        ("1048576Ki", 1024),
    ],
)
def test_memory_sizes_are_binary_and_a_bare_number_is_mib(value: object, mib: int) -> None:
    assert parse_memory_mib(value) == mib


@pytest.mark.parametrize("value", ["1Gb", "512mb", "1Gib", "lots", "16 parsecs", "Gi", "5i", "1e3", "-1Gi", ""])
def test_what_is_not_a_size_is_refused_naming_the_field_and_the_forms(value: str) -> None:
    with pytest.raises(NotAQuantity) as info:
        parse_memory_mib(value, field="memory")
    message = str(info.value)
    assert message.startswith(f"memory: {value!r} is not a quantity; use MiB as a number (512)")
    assert "'256Mi', '1Gi', '16GiB'" in message
    assert "16GB = 16GiB" in message  # says how GB is read


@pytest.mark.parametrize("value", [True, None, [512], b"512"])
def test_a_value_of_the_wrong_type_is_a_type_error_and_a_value_error(value: object) -> None:
    with pytest.raises(NotAQuantityType, match=r"^memory: .* is not a quantity") as info:
        parse_memory_mib(value, field="memory")
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, ValueError)


def test_memory_out_of_range_says_the_range() -> None:
    with pytest.raises(NotAQuantity, match=r"^memory: 0 is out of range; it must be at least 1 MiB and at most 16 TiB"):
        parse_memory_mib(0, field="memory", maximum=16 * 1024 * 1024)
    with pytest.raises(NotAQuantity, match=r"'0.3MiB' is not a whole number of MiB"):
        parse_memory_mib("0.3MiB")


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (0, 0),
        (65536, 64 * KIB),
        ("64KiB", 64 * KIB),
        ("64K", 64 * KIB),
        ("512MiB", 512 * MIB),
        ("1GiB", GIB),
        ("3B", 3),
    ],
)
def test_byte_sizes_take_a_bare_number_as_bytes(value: object, size: int) -> None:
    assert parse_bytes(value) == size


@pytest.mark.parametrize(
    ("value", "millicores"),
    [(0.125, 125), (2, 2000), ("0.5", 500), ("2", 2000), ("500m", 500), (".25", 250), (" 1500m ", 1500)],
)
def test_cpu_is_cores_or_millicores(value: object, millicores: int) -> None:
    assert parse_cpu_millicores(value) == millicores


@pytest.mark.parametrize("value", ["500M", "half", "1 core", "-1", "500mi"])
def test_what_is_not_a_cpu_amount_is_refused(value: str) -> None:
    with pytest.raises(NotAQuantity, match=r"^cpu: .* is not a CPU amount; use cores as a number \(0.5, 2\)"):
        parse_cpu_millicores(value)


def test_cpu_below_one_millicore_is_out_of_range() -> None:
    with pytest.raises(NotAQuantity, match=r"^cpu: 0.0001 is out of range; it must be at least 1m"):
        parse_cpu_millicores(0.0001)


def test_sizes_are_shown_in_the_largest_whole_unit() -> None:
    assert format_bytes(8 * MIB) == "8 MiB"
    assert format_bytes(41_943_040) == "40 MiB"
    assert format_bytes(1000) == "1,000 bytes"
    assert format_bytes(1536 * KIB) == "1,536 KiB"


def test_the_parser_imports_nothing_beyond_the_standard_library() -> None:
    code = (
        "import sys, levers9.quantities, levers9.stub_bounds; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'grpc', 'yaml', 'sqlalchemy')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
