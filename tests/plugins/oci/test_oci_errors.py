"""OCI's error codes: the table of what each means, and each one sent by the fake at its status (issue 35, 2/3).

:data:`EXPECTED` is written here from OCI's "API Errors" reference (every
(status, code) it lists) and the compute service's capacity answer,
independently of the plugin's :data:`levers9_oci.errors.CODES`; the table
test holds one to the other. The fake sends each code at the status the
reference gives it (:data:`tests.fakes.oci_cloud.STATUS`) to the real SDK:
every refused launch is one LaunchInstance call.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from levers9.hooks.errors import (
    AuthenticationFailed,
    InsufficientCapacity,
    InvalidRequest,
    PermissionDenied,
    ProviderError,
    QuotaExceeded,
    Throttled,
)
from levers9.hooks.types import Pool
from levers9_oci.errors import CODES, kind_of
from levers9_oci.provider import OciProvider
from tests.fakes.oci_cloud import STATUS, FakeOci
from tests.fakes.oci_tenancy import AD2, REGION
from tests.plugins.provision import provision_request

MakePool = Callable[..., Pool]

#: OCI's API Errors table, to the typed error levers9 must raise
EXPECTED: dict[tuple[int, str], type[ProviderError]] = {
    (400, "CannotParseRequest"): InvalidRequest,
    (400, "InvalidParameter"): InvalidRequest,
    (400, "LimitExceeded"): QuotaExceeded,
    (400, "MissingParameter"): InvalidRequest,
    (400, "QuotaExceeded"): QuotaExceeded,
    (400, "RelatedResourceNotAuthorizedOrNotFound"): InvalidRequest,
    (401, "NotAuthenticated"): AuthenticationFailed,
    (403, "NotAllowed"): InvalidRequest,
    (403, "NotAuthorized"): PermissionDenied,
    (403, "SignUpRequired"): AuthenticationFailed,
    (404, "InvalidParameter"): InvalidRequest,
    (404, "NotAuthorizedOrNotFound"): InvalidRequest,
    (404, "NotFound"): InvalidRequest,
    (404, "NamespaceNotFound"): InvalidRequest,
    (405, "MethodNotAllowed"): InvalidRequest,
    (409, "Conflict"): InvalidRequest,
    (409, "ExternalServerIncorrectState"): Throttled,
    (409, "IncorrectState"): Throttled,
    (409, "InvalidatedRetryToken"): InvalidRequest,
    (409, "NotAuthorizedOrResourceAlreadyExists"): InvalidRequest,
    (412, "NoEtagMatch"): InvalidRequest,
    (429, "TooManyRequests"): Throttled,
    (500, "InternalServerError"): Throttled,
    (500, "InternalError"): Throttled,
    (501, "MethodNotImplemented"): InvalidRequest,
    (503, "ServiceUnavailable"): Throttled,
}
CASES = sorted(EXPECTED.items(), key=lambda item: (item[0][1], item[0][0]))


def test_the_table_is_the_reference() -> None:
    assert dict(sorted(CODES.items())) == dict(sorted(EXPECTED.items()))
    for (status, code), _ in CASES:
        assert STATUS[code] in (status, 400), code  # the fake's status for a code listed twice is its first


def test_capacity_is_read_before_the_status() -> None:
    assert kind_of(500, "InternalError", "Out of host capacity.") is InsufficientCapacity
    assert kind_of(500, "InternalError", "Out of capacity for shape VM.GPU.A10.1 in AD-2") is InsufficientCapacity
    assert kind_of(500, "InternalError", "Internal error") is Throttled
    assert kind_of(501, "SomethingNew") is InvalidRequest  # 501 is not a transient server error
    assert kind_of(502, "SomethingNew") is Throttled
    assert kind_of(418, "SomethingNew") is None


@pytest.mark.parametrize(("key", "expected"), CASES, ids=[f"{s}-{c}" for (s, c), _ in CASES])
def test_each_code_at_its_status_is_typed_in_one_call(
    provider: OciProvider,
    make_pool: MakePool,
    fake_oci: FakeOci,
    key: tuple[int, str],
    expected: type[ProviderError],
) -> None:
    status, code = key
    pool = make_pool("gpu-a10")
    offer = provider.levers9_gpu_offers(pool)[1]
    fake_oci.fail_launch(status, code, f"the fake says {code}", shape="VM.GPU.A10.1", domain=AD2)
    with pytest.raises(ProviderError) as caught:
        provider.levers9_provision(provision_request(pool, offer))
    assert type(caught.value) is expected
    assert caught.value.code == code
    for part in ("gpu-a10", REGION, "VM.GPU.A10.1", AD2, f"the fake says {code}", f"HTTP {status}"):
        assert part in str(caught.value)
    assert fake_oci.calls("LaunchInstance") == 1
    assert fake_oci.instances() == []


@pytest.mark.parametrize(
    ("code", "limit"),
    [("LimitExceeded", "service limit"), ("QuotaExceeded", "compartment quota")],
)
def test_a_quota_holds_for_the_region_and_says_which_limit_to_raise(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci, code: str, limit: str
) -> None:
    pool = make_pool("gpu-a10")
    offer = provider.levers9_gpu_offers(pool)[0]
    fake_oci.refuse_launch(code, "gpu-a10-count has been exceeded")
    with pytest.raises(QuotaExceeded) as caught:
        provider.levers9_provision(provision_request(pool, offer))
    assert caught.value.scope == "region"
    assert f"raise the {limit}" in str(caught.value) or f"raise the tenancy's {limit}" in str(caught.value)
    assert "HTTP 400" in str(caught.value)
    assert fake_oci.calls("LaunchInstance") == 1


def test_out_of_host_capacity_sent_by_the_fake_is_capacity(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci
) -> None:
    pool = make_pool("gpu-a10")
    offer = provider.levers9_gpu_offers(pool)[0]
    fake_oci.refuse_launch("InternalError", "Out of host capacity.")
    with pytest.raises(InsufficientCapacity) as caught:
        provider.levers9_provision(provision_request(pool, offer))
    assert "HTTP 500" in str(caught.value)
    assert fake_oci.calls("LaunchInstance") == 1
