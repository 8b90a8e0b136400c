"""Lambda Cloud's error codes: the table of what each means, each sent by the fake at its status (issue 35, 2/3).

:data:`EXPECTED` is written here from the Cloud API reference's error codes,
independently of the plugin's :data:`levers9_lambda_labs.errors.CODES`; the
table test holds one to the other. The fake sends each code at its documented
status (:data:`tests.fakes.lambda_cloud.STATUS`) to the plugin's real HTTP
client; a quota is the whole account's.
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
from levers9_lambda_labs import LambdaLabsProvider
from levers9_lambda_labs.errors import CODES, kind_of
from tests.fakes.lambda_cloud import DEFAULT_API_KEY, STATUS, LambdaCloud
from tests.plugins.lambda_labs.conftest import request_for

MakePool = Callable[..., Pool]

#: the documented error codes, to the typed error levers9 must raise
EXPECTED: dict[str, type[ProviderError]] = {
    "instance-operations/launch/insufficient-capacity": InsufficientCapacity,
    "global/quota-exceeded": QuotaExceeded,
    "global/invalid-api-key": AuthenticationFailed,
    "global/account-inactive": AuthenticationFailed,
    "global/invalid-address": PermissionDenied,
    "global/invalid-parameters": InvalidRequest,
    "global/object-does-not-exist": InvalidRequest,
    "instance-operations/launch/file-system-in-wrong-region": InvalidRequest,
    "instance-operations/launch/file-systems-not-supported": InvalidRequest,
    "ssh-keys/key-in-use": InvalidRequest,
    "global/unknown": Throttled,
}
CASES = sorted(EXPECTED.items())


def test_the_table_is_the_reference() -> None:
    assert dict(sorted(CODES.items())) == dict(sorted(EXPECTED.items()))
    assert set(STATUS) == set(EXPECTED) | {"global/rate-limited"}


def test_codes_decide_before_statuses() -> None:
    assert kind_of(500, "instance-operations/launch/insufficient-capacity") is InsufficientCapacity
    assert kind_of(429, None) is Throttled
    assert kind_of(503, "provider/internal-unavailable") is Throttled
    assert kind_of(400, "provider/internal-unavailable") is Throttled
    assert kind_of(401, None) is AuthenticationFailed
    assert kind_of(403, None) is PermissionDenied
    assert kind_of(502, None) is Throttled
    assert kind_of(400, "something/new") is InvalidRequest


@pytest.mark.parametrize(("code", "expected"), CASES)
def test_each_code_at_its_status_is_typed(
    lambda_provider: LambdaLabsProvider,
    make_pool: MakePool,
    lambda_cloud: LambdaCloud,
    code: str,
    expected: type[ProviderError],
) -> None:
    pool = make_pool()
    request = request_for(lambda_provider, pool)
    lambda_cloud.refuse_launch(code, "refused by the test", times=1)
    with pytest.raises(ProviderError) as caught:
        lambda_provider.levers9_provision(request)
    assert type(caught.value) is expected
    assert caught.value.code == code
    for part in (pool.name, "us-east-1", "gpu_1x_a10", "refused by the test"):
        assert part in str(caught.value)
    assert DEFAULT_API_KEY not in str(caught.value)
    assert lambda_cloud.instances() == []


def test_a_quota_holds_for_the_whole_account(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    pool = make_pool()
    request = request_for(lambda_provider, pool)
    lambda_cloud.refuse_launch("global/quota-exceeded", "You have reached your instance quota.", times=1)
    with pytest.raises(QuotaExceeded) as caught:
        lambda_provider.levers9_provision(request)
    assert caught.value.scope == "account"
    assert "ask Lambda support to raise it" in str(caught.value)
    assert "every region" in str(caught.value)
