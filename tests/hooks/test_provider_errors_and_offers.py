"""The typed errors a provider raises and the offers it returns, as a plugin author meets them.

``BillingRefused`` (issue 38): a refused payment has its own kind, is no quota and is not retried by itself;
an agent's refusal naming it comes back as one. ``GpuOffer.details``: marketplace facts, bounded, each bound
refused with the field and the limit named.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from levers9.hooks.errors import ERROR_KINDS, BillingRefused, ProviderError, QuotaExceeded
from levers9.hooks.types import (
    OFFER_DETAILS_MAX_KEYS,
    OFFER_DETAILS_MAX_VALUE_CHARS,
    GpuOffer,
)


def test_billing_refused_is_a_provider_error_of_its_own_kind() -> None:
    exc = BillingRefused("insufficient balance", plugin="market", code="InsufficientBalance")
    assert isinstance(exc, ProviderError)
    assert not isinstance(exc, QuotaExceeded), "raising a limit would not help; paying would"
    assert exc.kind == "billing_refused"
    assert exc.retryable is False
    assert str(exc) == "[market] insufficient balance (InsufficientBalance)"
    assert ERROR_KINDS["billing_refused"] is BillingRefused, "an agent's refusal of this kind must come back as one"


def _offer(**details: Any) -> GpuOffer:
    return GpuOffer(gpu="H100", gpu_count=1, gpu_memory_mib=81559, details=details)


def test_offer_details_hold_marketplace_facts_and_are_empty_by_default() -> None:
    assert GpuOffer(gpu="H100", gpu_count=1, gpu_memory_mib=81559).details == {}
    offer = _offer(cloud="community", form_factor="pcie", host_reliability="0.9981")
    assert offer.details == {"cloud": "community", "form_factor": "pcie", "host_reliability": "0.9981"}
    assert offer.key == "H100/-/-", "details are for people to read; they never change what a miss marks"
    at_the_limits = _offer(**{f"k{i}": "v" * OFFER_DETAILS_MAX_VALUE_CHARS for i in range(OFFER_DETAILS_MAX_KEYS)})
    assert len(at_the_limits.details) == 16
    assert _offer(**{"a" + "b" * 31: "x"}).details == {"a" + "b" * 31: "x"}  # 32 characters: the longest key


@pytest.mark.parametrize(
    ("details", "says"),
    [
        ({f"k{i}": "v" for i in range(17)}, "details holds 17 keys; at most 16 are allowed"),
        ({"Cloud": "secure"}, "details key 'Cloud' is not allowed"),
        ({"1st": "x"}, "details key '1st' is not allowed"),
        ({"form-factor": "sxm"}, "details key 'form-factor' is not allowed"),
        ({"a" + "b" * 32: "x"}, "up to 31 lower-case letters, digits or '_'"),
        ({"note": "x" * 201}, "details['note'] is 201 characters long; at most 200 are allowed"),
    ],
)
def test_offer_details_out_of_bounds_are_refused_naming_the_field_and_the_limit(
    details: dict[str, str], says: str
) -> None:
    with pytest.raises(ValidationError, match="details") as caught:
        _offer(**details)
    assert says in str(caught.value)


def test_offer_details_are_text() -> None:
    with pytest.raises(ValidationError, match=r"details\.reliability\n  Input should be a valid string"):
        GpuOffer(gpu="H100", gpu_count=1, gpu_memory_mib=81559, details={"reliability": 0.99})  # type: ignore[dict-item]
