"""The ``lambda_labs`` provider beyond the contract: offers, the launch request, errors, idempotency, pacing.

Every test runs the plugin's real httpx client against the fake Cloud API
(:mod:`tests.fakes.lambda_cloud`) over HTTP; failures are injected into the
fake's answers, never into the client.
"""

from __future__ import annotations

import ast
import sys
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import levers9_lambda_labs
from levers9.bootstrap import cloud_init
from levers9.gpu.catalog import CATALOG
from levers9.hooks.context import PluginContext
from levers9.hooks.errors import (
    AuthenticationFailed,
    InsufficientCapacity,
    InvalidRequest,
    PermissionDenied,
    ProviderError,
    QuotaExceeded,
    Throttled,
)
from levers9.hooks.types import Availability, Machine, MachineState, Pool, ProvisionRequest
from levers9_lambda_labs import LambdaLabsProvider
from levers9_lambda_labs.provider import MACHINE_ID_TAG, POOL_TAG
from levers9_lambda_labs.ratelimit import LAUNCH_INTERVAL_S, LaunchPacer
from tests.fakes.lambda_cloud import DEFAULT_API_KEY, DEFAULT_SSH_KEY, LambdaCloud
from tests.plugins.lambda_labs.conftest import KEY_ENV, request_for

MakePool = Callable[..., Pool]

# --------------------------------------------------------------------------- offers


def test_offers_one_per_region_available_where_listed_and_priced(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool
) -> None:
    pool = make_pool(gpu="A10", regions=["us-east-1", "us-west-1"])
    offers = lambda_provider.levers9_gpu_offers(pool)
    by_region = {o.region: o for o in offers}
    assert set(by_region) == {"us-east-1", "us-west-1"}
    assert by_region["us-east-1"].availability is Availability.AVAILABLE
    assert by_region["us-west-1"].availability is Availability.UNAVAILABLE
    for offer in offers:
        assert offer.instance_type == "gpu_1x_a10"
        assert offer.price_per_hour == pytest.approx(0.75)
        assert (offer.gpu, offer.gpu_count, offer.zone) == ("A10", 1, None)
        assert offer.gpu_memory_mib == CATALOG["A10"].memory_mib
        assert offer.cpu_millicores == 30_000
        assert offer.memory_mib == 200 * 1024


def test_offers_follow_the_capacity_the_api_reports_now(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    pool = make_pool(gpu="A10", regions=["us-east-1", "us-west-1"])
    lambda_cloud.set_capacity("gpu_1x_a10", ["us-west-1"])
    by_region = {o.region: o.availability for o in lambda_provider.levers9_gpu_offers(pool)}
    assert by_region == {"us-east-1": Availability.UNAVAILABLE, "us-west-1": Availability.AVAILABLE}


def test_a_pool_without_regions_gets_every_region_the_api_names(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool
) -> None:
    pool = make_pool(gpu="H100", gpu_count=8, regions=[])
    offers = lambda_provider.levers9_gpu_offers(pool)
    assert {o.instance_type for o in offers} == {"gpu_8x_h100_sxm5"}
    # every region any type lists with capacity in the recorded answer
    assert sorted(o.region for o in offers if o.region) == ["us-east-1", "us-south-1", "us-west-2", "us-west-3"]
    assert [o.region for o in offers if o.availability is Availability.AVAILABLE] == ["us-west-3"]
    assert [o.price_per_hour for o in offers] == pytest.approx([23.92] * 4)


def test_offers_keep_the_pools_gpu_count_and_the_settings_instance_types(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool
) -> None:
    both = make_pool(gpu="A100-40", regions=["us-east-1"])
    assert {o.instance_type for o in lambda_provider.levers9_gpu_offers(both)} == {"gpu_1x_a100", "gpu_1x_a100_sxm4"}
    one = make_pool(gpu="A100-40", regions=["us-east-1"], instance_types=["gpu_1x_a100_sxm4"])
    assert [o.instance_type for o in lambda_provider.levers9_gpu_offers(one)] == ["gpu_1x_a100_sxm4"]
    assert lambda_provider.levers9_gpu_offers(make_pool(gpu="H100", gpu_count=2)) == []


def test_a_cpu_pool_gets_no_offers_and_asks_nothing(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    assert lambda_provider.levers9_gpu_offers(make_pool(gpu=None)) == []
    assert lambda_cloud.calls("/instance-types") == 0


# --------------------------------------------------------------------------- provision


def test_launch_sends_the_documented_request(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    lambda_cloud.add_file_system("datasets", "us-east-1")
    pool = make_pool(file_system_names=["datasets"], image_family="lambda-stack-22-04")
    request = request_for(lambda_provider, pool)
    machine = lambda_provider.levers9_provision(request)

    (body,) = lambda_cloud.launch_bodies()
    assert body == {
        "region_name": "us-east-1",
        "instance_type_name": "gpu_1x_a10",
        "ssh_key_names": [DEFAULT_SSH_KEY],
        "file_system_names": ["datasets"],
        "name": f"levers9-{request.machine_id}",
        "tags": [{"key": MACHINE_ID_TAG, "value": request.machine_id}, {"key": POOL_TAG, "value": pool.name}],
        "image": {"family": "lambda-stack-22-04"},
        "user_data": cloud_init(request.bootstrap),
    }
    (instance,) = lambda_cloud.instances()
    assert machine.provider_id == instance.id
    assert (machine.machine_id, machine.pool, machine.region) == (request.machine_id, pool.name, "us-east-1")
    assert machine.instance_type == "gpu_1x_a10"
    assert machine.provider_data == {"region": "us-east-1"}
    assert instance.tags == {MACHINE_ID_TAG: request.machine_id, POOL_TAG: pool.name}


def test_the_instance_name_is_cut_to_64_characters(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    long_id = "m-" + "x" * 80
    lambda_provider.levers9_provision(request_for(lambda_provider, make_pool(), machine_id=long_id))
    (body,) = lambda_cloud.launch_bodies()
    assert body["name"] == f"levers9-{long_id}"[:64]
    assert {"key": MACHINE_ID_TAG, "value": long_id} in body["tags"]


def test_user_data_that_cannot_be_rendered_is_refused_before_any_call(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    request = request_for(lambda_provider, make_pool(), controlplane_ca="x" * 20_000)
    with pytest.raises(InvalidRequest) as caught:
        lambda_provider.levers9_provision(request)
    assert caught.value.code == "user-data"
    assert lambda_cloud.calls("/instance-operations/launch") == 0


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (400, "instance-operations/launch/insufficient-capacity", InsufficientCapacity),
        (400, "global/quota-exceeded", QuotaExceeded),
        (401, "global/invalid-api-key", AuthenticationFailed),
        (403, "global/account-inactive", AuthenticationFailed),
        (403, "global/invalid-address", PermissionDenied),
        (400, "global/invalid-parameters", InvalidRequest),
        (400, "instance-operations/launch/file-system-in-wrong-region", InvalidRequest),
        (404, "global/object-does-not-exist", InvalidRequest),
        (429, "global/rate-limited", Throttled),
        (503, "provider/internal-unavailable", Throttled),
        # a 5xx that says "no capacity" started nothing: fail over at once
        (500, "instance-operations/launch/insufficient-capacity", InsufficientCapacity),
    ],
)
def test_launch_errors_map_to_typed_errors_with_the_lambda_code(
    lambda_provider: LambdaLabsProvider,
    make_pool: MakePool,
    lambda_cloud: LambdaCloud,
    status: int,
    code: str,
    expected: type[ProviderError],
) -> None:
    pool = make_pool()
    request = request_for(lambda_provider, pool)
    lambda_cloud.fail_launch(status, code, "refused by the test", suggestion="do something else", times=1)
    with pytest.raises(ProviderError) as caught:
        lambda_provider.levers9_provision(request)
    assert type(caught.value) is expected
    assert caught.value.code == code
    message = str(caught.value)
    assert pool.name in message
    assert "us-east-1" in message
    assert "gpu_1x_a10" in message
    assert "refused by the test" in message
    assert DEFAULT_API_KEY not in message
    assert lambda_cloud.instances() == []


def test_a_429_is_throttled_after_retry_after(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    request = request_for(lambda_provider, make_pool())
    lambda_cloud.fail_launch(429, "global/rate-limited", "slow down", retry_after=7, times=1)
    with pytest.raises(Throttled) as caught:
        lambda_provider.levers9_provision(request)
    assert caught.value.retry_after == 7


def test_the_fakes_documented_launch_limit_is_throttled(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    """With the plugin's pacing off, the API's own 429 for a second launch within 12 s is Throttled."""
    pool = make_pool()
    lambda_cloud.set_rate_limits(launch_interval_s=LAUNCH_INTERVAL_S)
    lambda_provider.levers9_provision(request_for(lambda_provider, pool))
    with pytest.raises(Throttled) as caught:
        lambda_provider.levers9_provision(request_for(lambda_provider, pool))
    assert caught.value.code == "global/rate-limited"
    assert caught.value.retry_after is not None
    assert 0 < caught.value.retry_after <= LAUNCH_INTERVAL_S
    assert len(lambda_cloud.instances()) == 1


def test_too_many_requests_per_second_is_throttled(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    pool = make_pool()
    lambda_cloud.set_rate_limits(requests_per_s=0.01, request_burst=1)
    assert lambda_provider.levers9_list_machines(pool) == []
    with pytest.raises(Throttled) as caught:
        lambda_provider.levers9_list_machines(pool)
    assert caught.value.retry_after is not None
    assert caught.value.retry_after >= 1


def test_the_real_answers_for_a_bad_ssh_key_no_capacity_and_a_bad_key(
    lambda_provider: LambdaLabsProvider,
    make_pool: MakePool,
    lambda_cloud: LambdaCloud,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fake's own validation, not injected faults: what the API answers for each mistake."""
    with pytest.raises(InvalidRequest) as bad_ssh:
        lambda_provider.levers9_provision(request_for(lambda_provider, make_pool(ssh_key_names=["nobody"])))
    assert bad_ssh.value.code == "global/object-does-not-exist"
    assert "nobody" in str(bad_ssh.value)

    lambda_cloud.set_capacity("gpu_1x_a10", [])
    with pytest.raises(InsufficientCapacity) as full:
        lambda_provider.levers9_provision(request_for(lambda_provider, make_pool()))
    assert full.value.code == "instance-operations/launch/insufficient-capacity"

    lambda_cloud.add_file_system("datasets", "us-west-2")
    lambda_cloud.set_capacity("gpu_1x_a10", ["us-east-1"])
    with pytest.raises(InvalidRequest) as elsewhere:
        lambda_provider.levers9_provision(request_for(lambda_provider, make_pool(file_system_names=["datasets"])))
    assert elsewhere.value.code == "instance-operations/launch/file-system-in-wrong-region"

    pool = make_pool()
    monkeypatch.setenv(KEY_ENV, "secret_not-the-accounts-key")
    with pytest.raises(AuthenticationFailed) as refused:
        lambda_provider.levers9_list_machines(pool)
    assert refused.value.code == "global/invalid-api-key"
    assert "secret_not-the-accounts-key" not in str(refused.value)
    assert lambda_cloud.instances() == []


def test_an_unset_key_variable_is_named_never_read_out(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = make_pool()
    monkeypatch.delenv(KEY_ENV)
    for call in (lambda_provider.levers9_gpu_offers, lambda_provider.levers9_list_machines):
        with pytest.raises(AuthenticationFailed) as caught:
            call(pool)
        assert KEY_ENV in str(caught.value)
    assert lambda_cloud.calls("/instance-types") == lambda_cloud.calls("/instances") == 0


# --------------------------------------------------------------------------- idempotency without an idempotency key


@pytest.mark.parametrize("how", ["reset", "timeout"])
def test_a_lost_launch_answer_is_found_by_its_tag_and_never_launched_twice(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud, how: str
) -> None:
    pool = make_pool(request_timeout_s=1)
    request = request_for(lambda_provider, pool)
    lambda_cloud.drop_launch_response(how=how)  # type: ignore[arg-type]
    machine = lambda_provider.levers9_provision(request)
    (instance,) = lambda_cloud.instances()
    assert machine.provider_id == instance.id
    assert machine.machine_id == request.machine_id
    assert machine.provider_data == {"region": "us-east-1"}

    again = lambda_provider.levers9_provision(request)
    assert again.provider_id == instance.id
    assert len(lambda_cloud.instances()) == 1
    assert lambda_cloud.calls("/instance-operations/launch") == 1


def test_a_5xx_without_an_instance_is_throttled_and_the_retry_launches_once(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    request = request_for(lambda_provider, make_pool())
    lambda_cloud.fail_launch(502, "global/internal-error", "bad gateway", times=1)
    with pytest.raises(Throttled) as caught:
        lambda_provider.levers9_provision(request)
    assert caught.value.code == "global/internal-error"
    assert "no instance tagged with the machine id is listed" in str(caught.value)
    assert lambda_cloud.instances() == []
    # looked before launching and again after the unclear answer
    assert lambda_cloud.calls("/instances") == 2

    machine = lambda_provider.levers9_provision(request)
    assert [i.id for i in lambda_cloud.instances()] == [machine.provider_id]


def test_a_terminated_instance_of_the_machine_id_does_not_count(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    pool = make_pool()
    request = request_for(lambda_provider, pool)
    first = lambda_provider.levers9_provision(request)
    lambda_provider.levers9_terminate(pool, first)
    second = lambda_provider.levers9_provision(request)
    assert second.provider_id != first.provider_id


# --------------------------------------------------------------------------- pacing


def test_a_launch_too_soon_is_throttled_at_once_while_other_calls_go_on(
    make_pool: MakePool, lambda_cloud: LambdaCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = LambdaLabsProvider(pacer=LaunchPacer(interval_s=LAUNCH_INTERVAL_S))
    provider.levers9_startup(PluginContext.bare("lambda_labs"))
    try:
        first_pool, second_pool = make_pool(), make_pool()
        provider.levers9_provision(request_for(provider, first_pool))

        # the same key, another pool: told how long to wait, without the request reaching the API
        with pytest.raises(Throttled) as caught:
            provider.levers9_provision(request_for(provider, second_pool))
        assert caught.value.code == "launch-paced"
        assert caught.value.retry_after is not None
        assert 0 < caught.value.retry_after <= LAUNCH_INTERVAL_S
        assert lambda_cloud.calls("/instance-operations/launch") == 1

        # the other pool's listing and offers still answer
        assert provider.levers9_list_machines(second_pool) == []
        assert provider.levers9_gpu_offers(second_pool)

        # another API key has a clock of its own
        lambda_cloud.add_api_key("secret_second-account")
        monkeypatch.setenv("LEVERS9_TEST_LAMBDA_KEY_2", "secret_second-account")
        other_key = make_pool(api_key_env="LEVERS9_TEST_LAMBDA_KEY_2")
        provider.levers9_provision(request_for(provider, other_key))
        assert lambda_cloud.calls("/instance-operations/launch") == 2
    finally:
        provider.levers9_shutdown(PluginContext.bare("lambda_labs"))


def test_launches_from_many_threads_at_once_let_exactly_one_through(
    make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    provider = LambdaLabsProvider(pacer=LaunchPacer(interval_s=LAUNCH_INTERVAL_S))
    provider.levers9_startup(PluginContext.bare("lambda_labs"))
    try:
        pools = [make_pool() for _ in range(6)]
        requests = [request_for(provider, pool) for pool in pools]
        start = threading.Barrier(len(requests))

        def launch(request: ProvisionRequest) -> Machine | Throttled:
            start.wait()
            try:
                return provider.levers9_provision(request)
            except Throttled as exc:
                return exc

        with ThreadPoolExecutor(len(requests)) as pool_of_threads:
            outcomes = list(pool_of_threads.map(launch, requests))
        launched = [o for o in outcomes if isinstance(o, Machine)]
        assert len(launched) == 1
        assert all(o.code == "launch-paced" for o in outcomes if isinstance(o, Throttled))
        assert [i.id for i in lambda_cloud.instances()] == [launched[0].provider_id]
    finally:
        provider.levers9_shutdown(PluginContext.bare("lambda_labs"))


def test_the_pacer_frees_the_slot_after_the_interval() -> None:
    now = [100.0]
    pacer = LaunchPacer(interval_s=12.0, clock=lambda: now[0])
    assert pacer.reserve("key") == 0.0
    now[0] += 5.0
    assert pacer.reserve("key") == pytest.approx(7.0)
    assert pacer.reserve("other") == 0.0
    now[0] += 7.0
    assert pacer.reserve("key") == 0.0


# --------------------------------------------------------------------------- terminate


def test_terminating_twice_and_an_unknown_id_succeed(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    pool = make_pool()
    machine = lambda_provider.levers9_provision(request_for(lambda_provider, pool))
    lambda_provider.levers9_terminate(pool, machine)
    lambda_provider.levers9_terminate(pool, machine)
    (instance,) = lambda_cloud.instances()
    assert instance.gone
    assert instance.state == "terminated"
    unknown = Machine(provider_id=uuid.uuid4().hex, pool=pool.name)
    lambda_provider.levers9_terminate(pool, unknown)
    assert lambda_cloud.calls("/instance-operations/terminate") == 3


def test_a_refused_terminate_of_an_instance_already_terminated_succeeds(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    pool = make_pool()
    machine = lambda_provider.levers9_provision(request_for(lambda_provider, pool))
    lambda_cloud.terminate_all()
    lambda_cloud.fail_request(
        "POST", "/instance-operations/terminate", 400, "global/invalid-parameters", "already terminated", times=2
    )
    lambda_provider.levers9_terminate(pool, machine)

    alive = lambda_provider.levers9_provision(request_for(lambda_provider, pool))
    with pytest.raises(InvalidRequest) as caught:
        lambda_provider.levers9_terminate(pool, alive)
    assert caught.value.code == "global/invalid-parameters"


def test_a_404_that_is_not_the_apis_is_no_success(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    """A wrong ``api_url`` answers 404 without the API's code: terminate must not report the instance gone."""
    pool = make_pool(api_url=lambda_cloud.url.removesuffix("/api/v1") + "/wrong/v1")
    with pytest.raises(InvalidRequest):
        lambda_provider.levers9_terminate(pool, Machine(provider_id="abc", pool=pool.name))


def test_terminate_errors_are_typed(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    pool = make_pool()
    machine = lambda_provider.levers9_provision(request_for(lambda_provider, pool))
    lambda_cloud.fail_request("POST", "/instance-operations/terminate", 500, "global/internal-error", "oops", times=1)
    with pytest.raises(Throttled):
        lambda_provider.levers9_terminate(pool, machine)
    lambda_cloud.fail_request("POST", "/instance-operations/terminate", 403, "global/account-inactive", "no", times=1)
    with pytest.raises(AuthenticationFailed):
        lambda_provider.levers9_terminate(pool, machine)


# --------------------------------------------------------------------------- list


def test_the_listing_keeps_the_pools_tagged_instances_and_maps_their_states(
    make_pool: MakePool, lambda_cloud: LambdaCloud, lambda_key: str
) -> None:
    lambda_cloud.boot_delay_s = 3600.0
    lambda_cloud.terminate_delay_s = 3600.0
    provider = LambdaLabsProvider(pacer=LaunchPacer(interval_s=0.0))
    try:
        pool, other = make_pool(), make_pool()
        launched = {
            status: provider.levers9_provision(request_for(provider, pool))
            for status in ("booting", "active", "unhealthy", "preempted", "terminating", "terminated")
        }
        for status in ("active", "unhealthy", "preempted", "terminated"):
            lambda_cloud.set_status(launched[status].provider_id, status)
        provider.levers9_terminate(pool, launched["terminating"])
        theirs = provider.levers9_provision(request_for(provider, other))
        # an instance levers9 did not launch: no tags at all
        httpx.post(
            f"{lambda_cloud.url}/instance-operations/launch",
            headers={"Authorization": f"Bearer {lambda_key}"},
            json={"region_name": "us-east-1", "instance_type_name": "gpu_1x_a10", "ssh_key_names": [DEFAULT_SSH_KEY]},
        ).raise_for_status()

        listed = {m.provider_id: m for m in provider.levers9_list_machines(pool)}
        expected = {
            "booting": MachineState.PENDING,
            "active": MachineState.RUNNING,
            "unhealthy": MachineState.FAILED,
            "preempted": MachineState.PREEMPTED,
            "terminating": MachineState.STOPPING,
        }
        assert {listed[launched[s].provider_id].state: s for s in expected} == {v: k for k, v in expected.items()}
        assert set(listed) == {launched[s].provider_id for s in expected}
        for status, machine in launched.items():
            if status in expected:
                found = listed[machine.provider_id]
                assert found.machine_id == machine.machine_id
                assert found.provider_data == {"region": "us-east-1"}
                assert (found.region, found.instance_type, found.gpu, found.gpu_count) == (
                    "us-east-1",
                    "gpu_1x_a10",
                    "A10",
                    1,
                )
        assert listed[launched["unhealthy"].provider_id].reason
        assert listed[launched["preempted"].provider_id].reason
        assert [m.provider_id for m in provider.levers9_list_machines(other)] == [theirs.provider_id]
    finally:
        provider.levers9_shutdown(PluginContext.bare("lambda_labs"))


def test_an_answer_without_tags_still_finds_levers9s_instances_by_name(
    make_pool: MakePool, lambda_cloud: LambdaCloud, lambda_key: str
) -> None:
    """Listing and the launch's idempotency match ``levers9-<machine id>`` when the answer carries no tags, so the
    reconciler never sees a live machine as gone; an instance levers9 did not name is still nobody's."""
    lambda_cloud.boot_delay_s = 3600.0
    provider = LambdaLabsProvider(pacer=LaunchPacer(interval_s=0.0))
    try:
        pool, other = make_pool(), make_pool()
        request = request_for(provider, pool)
        ours = provider.levers9_provision(request)
        httpx.post(
            f"{lambda_cloud.url}/instance-operations/launch",
            headers={"Authorization": f"Bearer {lambda_key}"},
            json={
                "region_name": "us-east-1",
                "instance_type_name": "gpu_1x_a10",
                "ssh_key_names": [DEFAULT_SSH_KEY],
                "name": "someone-elses",
            },
        ).raise_for_status()
        lambda_cloud.omit_tags = True

        listed = provider.levers9_list_machines(pool)
        assert [(m.provider_id, m.machine_id) for m in listed] == [(ours.provider_id, request.machine_id)]
        # the pool is unknown without tags: every pool lists it, and the core leaves it to the pool of its record
        assert [m.machine_id for m in provider.levers9_list_machines(other)] == [request.machine_id]
        again = provider.levers9_provision(request)  # a retried launch finds it by name, launches nothing
        assert again.provider_id == ours.provider_id
        assert lambda_cloud.calls("/instance-operations/launch") == 2
    finally:
        provider.levers9_shutdown(PluginContext.bare("lambda_labs"))


# --------------------------------------------------------------------------- check


def test_check_says_ok_with_the_variable_and_the_type_count(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, lambda_key: str
) -> None:
    check = lambda_provider.levers9_check(make_pool())
    assert check.ok
    assert KEY_ENV in check.message
    assert "11 instance types" in check.message
    assert lambda_key not in check.message


def test_check_not_ok_for_a_refused_or_unset_key_never_shows_the_key(
    lambda_provider: LambdaLabsProvider, make_pool: MakePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = make_pool()
    wrong = "secret_wrong-key-0123456789"
    monkeypatch.setenv(KEY_ENV, wrong)
    refused = lambda_provider.levers9_check(pool)
    assert not refused.ok
    assert "global/invalid-api-key" in refused.message
    assert KEY_ENV in refused.message
    assert refused.hint
    assert KEY_ENV in refused.hint
    assert wrong not in refused.message + refused.hint

    monkeypatch.delenv(KEY_ENV)
    unset = lambda_provider.levers9_check(pool)
    assert not unset.ok
    assert KEY_ENV in unset.message
    assert unset.hint
    assert KEY_ENV in unset.hint


# --------------------------------------------------------------------------- the plugin itself


def test_the_plugin_needs_no_sdk_but_httpx() -> None:
    """Only the standard library, pydantic (settings), httpx and levers9 itself are imported."""
    package = Path(levers9_lambda_labs.__file__).parent
    allowed = set(sys.stdlib_module_names) | {"httpx", "pydantic", "levers9", "levers9_lambda_labs"}
    imported: set[str] = set()
    for source in package.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
    assert "httpx" in imported
    assert imported <= allowed, f"the plugin imports {sorted(imported - allowed)}"


def test_shutdown_closes_the_clients_and_a_later_call_opens_a_new_one(
    make_pool: MakePool, lambda_cloud: LambdaCloud
) -> None:
    provider = LambdaLabsProvider(pacer=LaunchPacer(interval_s=0.0))
    provider.levers9_startup(PluginContext.bare("lambda_labs"))
    pool = make_pool()
    assert provider.levers9_list_machines(pool) == []
    provider.levers9_shutdown(PluginContext.bare("lambda_labs"))
    assert provider.levers9_list_machines(pool) == []
    provider.levers9_shutdown(PluginContext.bare("lambda_labs"))
    assert lambda_cloud.calls("/instances") == 2
