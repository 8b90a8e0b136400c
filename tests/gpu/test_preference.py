"""A job's GPU preference: what the SDK accepts, what it refuses and why, and how the scheduler reads it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from levers9.gpu import CATALOG, AmbiguousGpuType, GpuRequest, UnknownGpuType, parse_gpu
from levers9.gpu.preference import ALLOWED_GPU_COUNTS, DEFAULT_FALLBACK_AFTER_S

# --------------------------------------------------------------------------- parsing


def test_one_type() -> None:
    request = parse_gpu("H100")
    assert request == GpuRequest(types=("H100",), count=1)
    assert request.wants_gpu
    assert not request.any_gpu
    assert not request.fallback_cpu
    assert request.fallback_after_s == DEFAULT_FALLBACK_AFTER_S == 60.0


def test_list_keeps_order_and_canonicalises() -> None:
    request = parse_gpu(["h100", "a100-80gb", "L40S"], gpu_count=4)
    assert request.types == ("H100", "A100-80", "L40S")
    assert request.count == 4


def test_tuple_is_accepted() -> None:
    assert parse_gpu(("L4", "T4")).types == ("L4", "T4")


@pytest.mark.parametrize("gpu", [["H100", "H100"], ["H100", "h100"], ["A100-80", "a100_80gb"], ["V100S", "V100-32"]])
def test_duplicates_are_rejected(gpu: list[str]) -> None:
    with pytest.raises(ValueError, match="list each type once"):
        parse_gpu(gpu)


def test_duplicate_message_names_both_spellings() -> None:
    with pytest.raises(ValueError, match=r"'A100-80' and 'a100_80gb' both mean A100-80"):
        parse_gpu(["A100-80", "a100_80gb"])


@pytest.mark.parametrize("gpu", ["any", "ANY", " Any "])
def test_any(gpu: str) -> None:
    request = parse_gpu(gpu, gpu_count=2)
    assert request.any_gpu
    assert request.types == ()
    assert request.count == 2


@pytest.mark.parametrize("gpu", [["any", "H100"], ["H100", "any"]])
def test_any_does_not_mix_with_named_types(gpu: list[str]) -> None:
    with pytest.raises(ValueError, match="cannot be combined"):
        parse_gpu(gpu)


@pytest.mark.parametrize("gpu", [None, "cpu", ["cpu"]])
def test_cpu_only(gpu: str | list[str] | None) -> None:
    request = parse_gpu(gpu)
    assert request == GpuRequest()
    assert request.cpu_only
    assert request.count == 0
    assert not request.fallback_cpu


def test_empty_list_is_refused() -> None:
    with pytest.raises(ValueError, match="gpu=None"):
        parse_gpu([])


def test_cpu_at_the_end_of_the_list_is_the_fallback() -> None:
    request = parse_gpu(["H100", "A100-80", "cpu"])
    assert request.types == ("H100", "A100-80")
    assert request.fallback_cpu
    assert request == parse_gpu(["H100", "A100-80"], fallback=["cpu"])


def test_any_then_cpu() -> None:
    request = parse_gpu(["any", "CPU"])
    assert request.any_gpu
    assert request.fallback_cpu


def test_cpu_anywhere_but_last_is_refused() -> None:
    with pytest.raises(ValueError, match='"cpu" must be the last entry'):
        parse_gpu(["H100", "cpu", "A100-80"])


@pytest.mark.parametrize("fallback", [["cpu"], ["CPU"], ("cpu",), "cpu"])
def test_cpu_fallback(fallback: list[str] | tuple[str, ...] | str) -> None:
    request = parse_gpu("H100", fallback=fallback, fallback_after=120)
    assert request.fallback_cpu
    assert request.fallback_after_s == 120.0


@pytest.mark.parametrize("fallback", [["gpu"], ["cpu", "tpu"], [], ["A100-80"]])
def test_only_cpu_fallback_is_accepted(fallback: list[str]) -> None:
    with pytest.raises(ValueError, match=r'fallback accepts only \["cpu"\]'):
        parse_gpu("H100", fallback=fallback)


def test_cpu_fallback_for_a_cpu_job_is_harmless() -> None:
    assert parse_gpu(None, fallback=["cpu"]) == GpuRequest()


def test_fallback_after_needs_a_fallback() -> None:
    with pytest.raises(ValueError, match="no effect without a CPU fallback"):
        parse_gpu("H100", fallback_after=30)
    with pytest.raises(ValueError, match="without a gpu"):
        parse_gpu(None, fallback=["cpu"], fallback_after=30)


@pytest.mark.parametrize("after", [-1, float("inf"), float("nan")])
def test_fallback_after_must_be_sane(after: float) -> None:
    with pytest.raises(ValueError, match="fallback_after"):
        parse_gpu("H100", fallback=["cpu"], fallback_after=after)


def test_fallback_after_zero_means_at_once() -> None:
    assert parse_gpu("H100", fallback=["cpu"], fallback_after=0).fallback_after_s == 0.0


@pytest.mark.parametrize("count", ALLOWED_GPU_COUNTS)
def test_allowed_counts(count: int) -> None:
    assert parse_gpu("H100", gpu_count=count).count == count


@pytest.mark.parametrize("count", [0, 3, 5, 6, 7, 16, -1])
def test_other_counts_are_refused_with_the_reason(count: int) -> None:
    with pytest.raises(ValueError, match="gpu_count must be 1, 2, 4 or 8") as info:
        parse_gpu("H100", gpu_count=count)
    assert "one machine" in str(info.value)


def test_count_must_be_an_integer() -> None:
    with pytest.raises(TypeError):
        parse_gpu("H100", gpu_count=True)
    with pytest.raises(TypeError):
        parse_gpu("H100", gpu_count=2.0)  # type: ignore[arg-type]


def test_count_without_gpu_is_refused() -> None:
    with pytest.raises(ValueError, match="without a gpu"):
        parse_gpu(None, gpu_count=2)
    assert parse_gpu(None, gpu_count=0).count == 0


def test_unknown_type_suggests_valid_names() -> None:
    with pytest.raises(UnknownGpuType) as info:
        parse_gpu(["H100", "L40X"])
    assert info.value.name == "L40X"
    assert "L40" in info.value.suggestions
    assert "did you mean" in str(info.value)


def test_bare_a100_asks_which() -> None:
    with pytest.raises(AmbiguousGpuType, match="A100-40 or A100-80"):
        parse_gpu("A100")


def test_wrong_types_are_type_errors() -> None:
    with pytest.raises(TypeError):
        parse_gpu(100)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        parse_gpu(["H100", 3])  # type: ignore[list-item]


def test_classmethod_is_the_same_parser() -> None:
    assert GpuRequest.parse(["H100", "cpu"], gpu_count=8) == parse_gpu(["H100"], 8, ["cpu"])


# --------------------------------------------------------------------------- the model itself


def test_model_is_frozen() -> None:
    request = parse_gpu("H100")
    with pytest.raises(ValidationError):
        request.count = 2  # type: ignore[misc]


def test_model_validates_when_built_directly() -> None:
    assert GpuRequest(types=("h100", "a100-80"), count=1).types == ("H100", "A100-80")
    with pytest.raises(ValidationError, match="cannot be combined"):
        GpuRequest(types=("H100",), any_gpu=True, count=1)
    with pytest.raises(ValidationError, match="gpu_count must be"):
        GpuRequest(types=("H100",), count=3)
    with pytest.raises(ValidationError, match="gpu_count must be"):
        GpuRequest(types=("H100",))  # a GPU job needs a count
    with pytest.raises(ValidationError, match="without a gpu"):
        GpuRequest(count=1)
    with pytest.raises(ValidationError, match="needs a GPU to fall back from"):
        GpuRequest(fallback_cpu=True)
    with pytest.raises(ValidationError, match="unknown GPU type"):
        GpuRequest(types=("H1000",), count=1)
    with pytest.raises(ValidationError, match="list each type once"):
        GpuRequest(types=("H100", "h100"), count=1)
    with pytest.raises(ValidationError):
        GpuRequest(types=("H100",), count=1, fallback_cpu=True, fallback_after_s=-5)
    with pytest.raises(ValidationError):
        GpuRequest(types=("H100",), count=1, colour="red")  # type: ignore[call-arg]


def test_round_trips_through_json() -> None:
    request = parse_gpu(["H100", "L40S", "cpu"], gpu_count=2, fallback_after=15)
    assert GpuRequest.model_validate_json(request.model_dump_json()) == request


# --------------------------------------------------------------------------- reading it


def test_rank_and_accepts_for_a_list() -> None:
    request = parse_gpu(["H100", "A100-80", "L40S"])
    assert [request.rank(t) for t in ("H100", "A100-80", "L40S")] == [0, 1, 2]
    assert request.rank("h100") == 0  # loosely spelt
    assert request.rank("T4") is None
    assert request.rank("not-a-gpu") is None
    assert request.rank(None) is None
    assert request.accepts("A100-80")
    assert not request.accepts("A100-40")
    assert not request.accepts(None)


def test_rank_with_cpu_fallback_puts_cpu_last() -> None:
    request = parse_gpu(["H100", "A100-80", "cpu"])
    assert request.rank(None) == 2
    assert request.accepts(None)


def test_rank_for_any() -> None:
    request = parse_gpu("any")
    assert all(request.rank(name) == 0 for name in CATALOG)
    assert request.rank("not-a-gpu") is None
    assert request.rank(None) is None
    with_cpu = parse_gpu("any", fallback=["cpu"])
    assert with_cpu.rank(None) == 1
    assert with_cpu.rank("T4") == 0


def test_cpu_only_job_takes_only_cpu_machines() -> None:
    request = parse_gpu(None)
    assert request.rank(None) == 0
    assert request.accepts(None)
    assert not request.accepts("T4")


@pytest.mark.parametrize(
    ("request_", "text"),
    [
        (parse_gpu(None), "CPU only"),
        (parse_gpu("H100"), "1x H100"),
        (parse_gpu(["H100", "A100-80"], gpu_count=8), "8x H100, else A100-80"),
        (parse_gpu("any", gpu_count=2), "2x any GPU"),
        (parse_gpu(["L4", "cpu"]), "1x L4, else CPU after 60 s"),
        (parse_gpu("L4", fallback=["cpu"], fallback_after=2.5), "1x L4, else CPU after 2.5 s"),
    ],
)
def test_describe(request_: GpuRequest, text: str) -> None:
    assert request_.describe() == text


@given(
    types=st.lists(st.sampled_from(list(CATALOG)), min_size=1, max_size=6, unique=True),
    count=st.sampled_from(ALLOWED_GPU_COUNTS),
    cpu=st.booleans(),
)
def test_rank_follows_the_written_order(types: list[str], count: int, cpu: bool) -> None:
    request = parse_gpu([*types, "cpu"] if cpu else types, gpu_count=count)
    assert request.types == tuple(types)
    assert request.count == count
    for position, name in enumerate(types):
        assert request.rank(name) == position
        assert request.accepts(name)
    for name in set(CATALOG) - set(types):
        assert not request.accepts(name)
    assert request.rank(None) == (len(types) if cpu else None)
